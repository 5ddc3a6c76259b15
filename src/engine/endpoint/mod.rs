//! The multiplexer's state, without sockets, threads or a clock: one [`Endpoint`] per client.
//!
//! An endpoint owns every node's two connections (one pipelined connection for commands, one
//! for pub/sub wake-ups) and everything about them: the replies owed in order and whom each
//! belongs to, the setup and the commands held behind it, what the node's server is and
//! offers, the reconnect backoff, the slow-node breaker, the compare-and-deletes to send again
//! after a broken connection, and the wake channels with their reference counts. Many
//! callers (threads, or simulated callers) run lock operations over it at once; each has a
//! mailbox, and every reply, failure, write, wake message and confirmation is routed to the
//! mailbox of the caller (and the run of its operation) it belongs to.
//!
//! Time comes in as `now`; bytes come in through [`recv_buf`](Endpoint::recv_buf) and
//! [`handle_recv`](Endpoint::handle_recv) and go out through [`pending`](Endpoint::pending)
//! and [`handle_sent`](Endpoint::handle_sent); the sockets to open and close come out of
//! [`poll_io`](Endpoint::poll_io). The I/O shell (the mio driver, or the simulation) does
//! the system calls, and parks and wakes the callers [`poll_notified`](Endpoint::poll_notified)
//! names.
//!
//! A caller runs one operation's machine with [`step`](Endpoint::step): everything in its
//! mailbox is fed to the machine, then every command the machine transmits is queued on the
//! nodes' connections (or fails at once on a node that cannot take it).
//!
//! # Decisions taken here, and nowhere else
//!
//! - **The form of a command.** A command is written for what the node's server offers, as
//!   the last completed setup of any of its connections said. A reconnect keeps that
//!   knowledge: what a lock operation sends never depends on whether a new connection's setup
//!   has been answered yet. If a new setup says the server changed (an upgrade, a downgrade),
//!   the commands held behind it, written for the server it was, fail
//!   ([`NodeErrorKind::ServerChanged`]) rather than go out in the wrong form.
//! - **Node timeouts.** A command's node timeout counts from when it was written (the machine
//!   is told, `Machine::handle_written`). An acquisition is not sent to a node that still owes
//!   a reply older than the node timeout (it counts as timed out there at once): a node too
//!   slow for the load would otherwise get more than it can answer, without end. Releases and
//!   cleanups still go, but for the cleanup of an attempt that was not sent there (it has
//!   nothing to delete, and every lost attempt of every caller would send one). A connection is never given up for slowness: a slow or paused node
//!   answers its backlog in order when it can, so an acquisition queued there can never land
//!   after its release. Dead peers are found by the transport (TCP keepalive and a user
//!   timeout on unacknowledged data), which the shell reports as a failure.
//! - **A give-back is its holder's release there.** A semaphore holder's give-back of a slot
//!   granted beyond its quorum (`What::GiveBack`) is the compare-and-delete its release sends:
//!   on a plain node (no `?wait`, no sentinels, no cluster) that answered it on the connection
//!   it still has, the release is answered with that answer and not sent; while it is on its
//!   way, its answer is the release's. A failed connection forgets what its node answered.
//! - **Releases survive a broken connection.** A compare-and-delete (a release, a cleanup, an
//!   undo) whose connection broke before its reply came is sent again first thing on the
//!   node's next connection, until what it deletes has expired anyway. The connection broke on
//!   the server's side (it was closed, reset or found dead), so no command of the old
//!   connection can still run after it. On a cluster member, it goes to the master that serves
//!   its key's slot once the topology is read again, which may not be the one it was sent to.
//! - **Releases reach the replicas a member asks for.** On a member with `?wait=N` (or
//!   `?waitaof=L,R`), a release counts as done there only once the `WAIT` after it says N
//!   replicas have it; one that falls short stays owed: a later `WAIT` on its connection (a
//!   grant's, or the endpoint's own once the connection is idle, after a backoff) confirms
//!   it, and one whose connection breaks first (or before its `WAIT` answers) goes again,
//!   with its `WAIT`, on the node's next connection (to the master promoted in a failover, which may not have had
//!   it). Every compare-and-delete sent again is waited for the same way. A lost attempt's
//!   cleanup goes first without a `WAIT` of its own, and counts as done only once a `WAIT`
//!   sent after it on its connection says enough replicas have it (see the `confirm` module);
//!   those sent again on a new connection go behind one `WAIT` for them all.
//! - **Releases survive a refusal that passes.** A compare-and-delete answered `NOSCRIPT` is
//!   sent again at once with its script's body; one answered `BUSY`, `TRYAGAIN` or `LOADING`
//!   (it did not run) is sent again on the same connection after a short backoff, until
//!   what it deletes has expired anyway. Every compare-and-delete not answered yet asks to be
//!   seen through while no caller runs ([`needs_tending`](Endpoint::needs_tending)): only
//!   reading its reply tells whether it ran (on a ready connection, that can wait a moment
//!   for the next call: see [`tending_urgent`](Endpoint::tending_urgent)).
//! - **Duplicate servers.** Two nodes whose setups report the same `run_id` are one server
//!   reached twice: the later one's setup fails as a configuration error. (The links of one
//!   cluster member may reach one server twice; two members may not share one.)
//! - **Routing on a cluster member.** A member that is a Redis Cluster has a node (a *link*)
//!   per master in use, and a command goes to the master of its first key's slot, as the
//!   member's slot map says (see the `cluster` module). A `MOVED` moves the slot in the map
//!   and the command is sent to the master named, an `ASK` sends it there after `ASKING`, both
//!   within its node timeout and at most a few times; a slot without a master fails the
//!   member for that command (`CLUSTERDOWN`), and `TRYAGAIN` or `CLUSTERDOWN` replies are
//!   failures as any error reply is: never a vote. The map is read again on a `MOVED`, when a
//!   link breaks, and periodically. Replies, failures and timeouts of every link are the
//!   member's.
#![forbid(unsafe_code)]

mod bits;
mod caller;
pub(crate) mod cluster;
mod confirm;
mod conn;
mod mail;
pub(crate) mod seats;
mod sentinel;
pub(crate) mod setup;
mod subs;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::machine::{Machine, To, Transmit, What};
use crate::engine::ops::Caps;
use crate::engine::timings;
use crate::error::{NodeErrorKind, TlsFailure};
use crate::resp::Reply;
use crate::rng::{Entropy, Token};
use crate::stats::Recorder;
use crate::url::{NodeAddr, Target};

pub(crate) use bits::Bits;
pub(crate) use caller::{CallerLoop, Next};
use cluster::{Kept, Topology};
use confirm::Unconfirmed;
use conn::{Conn, Redo, Refused, Slot, BACKOFF_MAX, BACKOFF_MIN, MAX_OWED};
pub(crate) use mail::Event;
use mail::Mail;
pub(crate) use sentinel::sentinels_failure;
use sentinel::Watch;
use setup::{Server, Setup};
use subs::{Channels, Push};

/// A caller of an endpoint: one thread (or simulated caller) running lock operations.
pub(crate) type CallerId = usize;

/// One of a node's two connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConnId {
    pub node: usize,
    /// The pub/sub connection, not the command connection.
    pub sub: bool,
}

impl ConnId {
    /// A number unique to this connection among the endpoint's: `2 × node (+ 1)`.
    pub fn index(self) -> usize {
        2 * self.node + usize::from(self.sub)
    }

    /// The connection with [`index`](Self::index) `i`.
    pub fn from_index(i: usize) -> ConnId {
        ConnId {
            node: i / 2,
            sub: i % 2 == 1,
        }
    }
}

/// A system call for the I/O shell to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Io {
    /// Open a socket to the connection's node and start connecting; report the outcome with
    /// [`Endpoint::handle_connected`] or [`Endpoint::handle_failed`].
    Connect(ConnId),
    /// Close the connection's socket: the endpoint has given it up.
    Close(ConnId),
    /// Find out, with a blocking probe of `timeout` at most, why the server of the connection
    /// (its socket closed already) closed it before answering anything: whether it answers a
    /// TLS hello (the connection was plaintext), or its verdict on this client's certificate
    /// (a TLS one). Report with [`Endpoint::handle_probed`]: the connection's failure waits
    /// for it.
    Probe { id: ConnId, timeout: Duration },
    /// Resolve the host name a sentinel of Sentinel member `member` named its master by
    /// ([`Endpoint::name_to_resolve`]: from its answer, or from a `+switch-master` message
    /// with `switch`), and report the first address with [`Endpoint::handle_resolved`].
    Resolve { member: usize, switch: bool },
}

/// What a probe ([`Io::Probe`]) found.
#[derive(Debug)]
pub(crate) enum Probed {
    /// Nothing that says the configuration is wrong.
    Nothing,
    /// The server answered a TLS hello: a TLS port.
    AnswersTls,
    /// The TLS server refused this client, for this reason.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Refused(NodeErrorKind),
}

/// How long a probe (see [`Io::Probe`]) may take at most: the connect timeout, up to this.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// A compare-and-delete owed by a broken connection, to send again on the next one.
#[derive(Debug, Clone, Copy)]
struct Retry {
    slot: Slot,
    redo: Redo,
}

/// A reply held until the `WAIT` and `WAITAOF` queued after its command say enough replicas
/// (and fsyncs) have the write: only then does it count. A compare-and-delete (a release, a
/// cleanup, an undo) keeps its bytes: one that falls short stays owed, as one of a broken
/// connection does, until what it deletes has expired anyway. A master's acknowledgment alone
/// is lost with the master in a failover, and the key with it would be left on the replica
/// promoted in its place.
#[derive(Debug)]
struct Awaiting {
    slot: Slot,
    reply: Vec<u8>,
    /// A compare-and-delete's commands (empty for any other command).
    command: Vec<u8>,
    /// The replies read for it so far: its own, and the waits that said enough.
    reads: u64,
}

impl Awaiting {
    fn new(slot: Slot, reply: &[u8], command: &[u8]) -> Awaiting {
        Awaiting {
            slot,
            reply: reply.to_vec(),
            command: if slot.redo().is_some() {
                command.to_vec()
            } else {
                Vec::new()
            },
            reads: 1,
        }
    }

    /// Until when it is worth holding on to, for a compare-and-delete.
    fn redo_until(&self) -> Option<Instant> {
        self.slot.redo().map(|r| r.until)
    }
}

/// One node: its connections, and what the endpoint knows of its server. The first nodes are
/// the quorum members, one each; a member that is a Redis Cluster has more, one per master in
/// use (its *links*; see the `cluster` module).
#[derive(Debug)]
struct Node {
    /// The quorum member it is, or is a link of.
    member: usize,
    /// A master of a cluster member: its address (a member's own is in the configuration).
    addr: Option<Box<NodeAddr>>,
    /// On a cluster member's links: the bytes of the commands owed a reply, to redirect.
    kept: Kept,
    /// A reply held until the `WAIT` (and `WAITAOF`) after its command answers: a grant's,
    /// an extend's, or a compare-and-delete's (see [`Awaiting`]).
    awaiting: Option<Awaiting>,
    cmd: Conn,
    sub: Conn,
    /// As the last completed setup said; what commands are written for.
    server: Server,
    /// A setup of this node has completed (or another endpoint's, adopted).
    known: bool,
    /// Compare-and-deletes of broken connections, with their bytes in `retry_bytes`, in order;
    /// and those the node refused for a while (see [`Refused::Transient`]).
    retries: Vec<Retry>,
    retry_bytes: Vec<u8>,
    /// While the connection is up: when the refused compare-and-deletes among `retries` go on
    /// it again, and the wait before the next such try.
    again_at: Option<Instant>,
    again_backoff: Duration,
    /// The tokens of the last acquisition attempts that were not sent here (failed at once):
    /// their cleanups have nothing to delete here.
    unsent: [Option<Token>; UNSENT],
    unsent_next: usize,
    /// On a member that waits for replicas: the cleanups its command connection ran that no
    /// `WAIT` confirmed yet (see the `confirm` module).
    unconfirmed: Unconfirmed,
    /// Compare-and-deletes were queued again without a `WAIT` behind them (see
    /// [`Endpoint::wait_after_owed`]).
    unwaited: bool,
    /// The holders whose give-backs (see `What::GiveBack`) this node answered on its command
    /// connection as it is: a release of one of them has nothing left to do here.
    given: [Option<Token>; GIVEN],
    given_next: usize,
}

/// How many attempts kept off a node are remembered, so that their cleanups are not sent
/// there (one forgotten only costs a useless cleanup).
const UNSENT: usize = 64;

/// How many answered give-backs a node remembers (one forgotten only costs its holder's
/// release being sent there too).
const GIVEN: usize = 16;

impl Node {
    /// The attempt with `token` was not sent to this node.
    fn unsent(&mut self, token: Token) {
        self.unsent[self.unsent_next] = Some(token);
        self.unsent_next = (self.unsent_next + 1) % UNSENT;
    }

    /// Whether compare-and-deletes are owed here that are still worth it at `now`: kept to
    /// send again, not answered yet, or answered and waiting for the replicas to have them.
    fn owes_until(&self, now: Instant) -> bool {
        self.retries.iter().any(|r| r.redo.until > now)
            || self.cmd.redo_until().is_some_and(|u| u > now)
            || self.awaiting.as_ref().and_then(Awaiting::redo_until) > Some(now)
            || self.unconfirmed.owes_until(now)
    }

    /// Whether this node answered the give-back of the holder with `token` on its command
    /// connection as it is (forgetting it: the holder's release is the last command about it).
    fn was_given(&mut self, token: Token) -> bool {
        match self.given.iter_mut().find(|t| **t == Some(token)) {
            Some(t) => {
                *t = None;
                true
            }
            None => false,
        }
    }

    /// Whether the attempt with `token` was not sent here (forgetting it: its cleanup is the
    /// last command about it).
    fn was_unsent(&mut self, token: Token) -> bool {
        match self.unsent.iter_mut().find(|t| **t == Some(token)) {
            Some(t) => {
                *t = None;
                true
            }
            None => false,
        }
    }
}

/// One transmit's bytes, encoded once for all the nodes whose servers offer the same.
#[derive(Default)]
struct Encoded {
    bytes: Vec<u8>,
    /// For what the bytes were encoded, and how many replies come before the command's own;
    /// `None` when nothing valid is held.
    for_caps: Option<(Caps, usize)>,
}

impl Encoded {
    /// Appends to `out` the transmit's bytes for `caps`: a copy of the last encoding if it was
    /// for the same capabilities, else a fresh one by `encode`, kept for the next node.
    fn write(
        &mut self,
        caps: Caps,
        out: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>) -> usize,
    ) -> usize {
        if let Some((c, before)) = self.for_caps {
            if c == caps {
                out.extend_from_slice(&self.bytes);
                return before;
            }
        }
        let start = out.len();
        let before = encode(out);
        self.bytes.clear();
        self.bytes.extend_from_slice(&out[start..]);
        self.for_caps = Some((caps, before));
        before
    }
}

/// A client's connections and callers, without I/O (see the module docs).
pub(crate) struct Endpoint {
    config: Arc<Config>,
    stats: Arc<Recorder>,
    nodes: Vec<Node>,
    /// How many quorum members: the first nodes.
    members: usize,
    /// Per member, its slot map when it is a Redis Cluster.
    topo: Vec<Option<Topology>>,
    /// Per member, its sentinels and master when it is a master managed by Redis Sentinel.
    sentinels: Vec<Option<Watch>>,
    /// Where a command for a cluster member is written to find its slot.
    scratch: Vec<u8>,
    mail: Mail,
    channels: Channels,
    encoded: Encoded,
    io: VecDeque<Io>,
    /// The connections whose failure waits for a probe ([`Io::Probe`]), with the failure.
    probing: Vec<(ConnId, NodeErrorKind)>,
    next_run: u64,
    /// While the client closes: when it gives up at the latest, and when a node last answered.
    closing: Option<Closing>,
    /// When the last close gave up at the latest, while no operation began since.
    closed_until: Option<Instant>,
    /// The connections (by [`ConnId::index`]) that may have bytes to write since the shell
    /// last asked ([`take_dirty`](Endpoint::take_dirty)).
    dirty: Bits,
    /// The places of links given up (see [`reclaim_links`](Endpoint::reclaim_links)), for the
    /// next masters. A cluster member has as many links as masters in use: there is no limit
    /// but what the cluster has.
    free: Vec<usize>,
}

/// A reply that redirected a command of a cluster member, to follow once the replies read
/// with it are routed.
struct Redirected {
    to: cluster::Redirect,
    slot: Slot,
    /// The command's bytes, `before` replies before its own, and the redirections followed.
    bytes: Vec<u8>,
    before: usize,
    hops: u8,
    /// A `WAIT` followed it, and follows it again.
    wait: bool,
    /// The reply itself: what the owner is given if the redirection is not followed.
    reply: Vec<u8>,
}

/// A compare-and-delete that its node answered without running it (see [`Refused`]), to send
/// again once the replies read with it are routed.
struct Refusal {
    slot: Slot,
    kind: Refused,
    /// Its commands' bytes, and how many replies come before its own.
    command: Vec<u8>,
    before: usize,
    /// The reply: what the owner is given if it is not sent again.
    reply: Vec<u8>,
}

/// How long closing waits at most for the nodes to answer what they were sent, and how long
/// without any answer before it gives up on those that still owe.
pub(crate) const CLOSE_LIMIT: Duration = Duration::from_secs(10);
pub(crate) const CLOSE_STALL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Closing {
    until: Instant,
    progress: Instant,
}

impl Endpoint {
    /// An endpoint for `config`'s nodes, every connection down and due to connect; reply
    /// latencies and node failures are counted in `stats`.
    pub fn new(config: Arc<Config>, stats: Arc<Recorder>, now: Instant) -> Endpoint {
        let n = config.nodes.len();
        let mut ep = Endpoint {
            nodes: (0..n)
                .map(|i| Node {
                    member: i,
                    addr: None,
                    kept: Kept::default(),
                    awaiting: None,
                    cmd: Conn::new(true, now),
                    sub: Conn::new(false, now),
                    server: Server::for_member(config.nodes[i].cluster),
                    known: false,
                    retries: Vec::new(),
                    retry_bytes: Vec::new(),
                    again_at: None,
                    again_backoff: BACKOFF_MIN,
                    unsent: [None; UNSENT],
                    unsent_next: 0,
                    unconfirmed: Unconfirmed::default(),
                    unwaited: false,
                    given: [None; GIVEN],
                    given_next: 0,
                })
                .collect(),
            members: n,
            topo: config
                .nodes
                .iter()
                .map(|a| a.cluster.then(|| Topology::new(now)))
                .collect(),
            sentinels: (0..n).map(|_| None).collect(),
            scratch: Vec::new(),
            mail: Mail::default(),
            channels: Channels::new(n, n),
            encoded: Encoded::default(),
            io: VecDeque::new(),
            probing: Vec::new(),
            next_run: 1,
            closing: None,
            closed_until: None,
            dirty: Bits::with_room(2 * n),
            free: Vec::new(),
            config,
            stats,
        };
        // A Sentinel member's link to its sentinels, past the members.
        for member in 0..n {
            if let Some(node) = sentinel::link_node(member, &ep.config.nodes[member], now) {
                ep.nodes.push(node);
                ep.sentinels[member] = Some(sentinel::new_watch(ep.nodes.len() - 1, now));
            }
        }
        ep.channels.grow(ep.nodes.len());
        ep
    }

    /// The settings the endpoint runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Takes what `other` (an endpoint over the same nodes) knows of each node's server, so
    /// that commands queued before this one's first setups are answered go in the right form:
    /// for a client used in a child process after `fork()`, which opens connections of its own.
    /// The masters its Sentinel members were using are taken too (see `adopt_masters`).
    pub fn adopt_servers(&mut self, other: &Endpoint) {
        for (mine, theirs) in self.nodes.iter_mut().zip(&other.nodes) {
            mine.server = theirs.server;
            mine.known = theirs.known;
        }
        self.adopt_masters(other);
    }

    // --- callers -------------------------------------------------------------------------

    /// A new caller, with an empty mailbox.
    pub fn open_caller(&mut self) -> CallerId {
        self.mail.open()
    }

    /// Starts an operation for `caller`: returns its run id, which routes replies to it.
    pub fn begin(&mut self, caller: CallerId) -> u64 {
        self.closed_until = None;
        let run = self.next_run;
        self.next_run += 1;
        self.mail.begin(caller, run);
        run
    }

    /// The operation `run` of `caller` is over: its channels are let go, its mailbox closed
    /// (replies still owed to it are dropped when they come).
    pub fn finish(&mut self, caller: CallerId, run: u64, now: Instant) {
        self.unsubscribe(caller, run, now);
        self.mail.finish(caller);
    }

    /// The run of `caller`'s operation under way, if one is.
    pub fn run_of(&self, caller: CallerId) -> Option<u64> {
        self.mail.run_of(caller)
    }

    /// Whether anything was posted to `caller` since its machine last stepped.
    pub fn has_mail(&self, caller: CallerId) -> bool {
        self.mail.has_events(caller)
    }

    /// Whether `caller`'s mailbox holds what its machine needs to move on: `wanted` replies
    /// (see `Machine::replies_wanted`), or anything else that must reach it at once.
    pub fn is_ready(&mut self, caller: CallerId, wanted: usize) -> bool {
        self.mail.is_ready(caller, wanted)
    }

    /// The next caller posted to since it was last named here: the shell wakes it if it waits.
    pub fn poll_notified(&mut self) -> Option<CallerId> {
        self.mail.poll_notified()
    }

    /// Callers with an operation under way.
    pub fn active_callers(&self) -> impl Iterator<Item = CallerId> + '_ {
        self.mail.active()
    }

    /// Feeds `caller`'s machine `m` (running as `run`) everything in its mailbox, then queues
    /// every command it transmits: each node's command behind whatever other callers queued
    /// there, or a failure at once for a node that cannot take it.
    pub fn step<M: Machine>(
        &mut self,
        caller: CallerId,
        run: u64,
        m: &mut M,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        self.mail.deliver(caller, m, &self.config.limits, now, rng);
        while let Some(t) = m.poll_transmit() {
            self.encoded.for_caps = None;
            match t.to {
                To::All => {
                    for i in 0..self.members {
                        self.send_to(i, &t, m, caller, run, now, rng);
                    }
                }
                To::Node(i) if i < self.members => self.send_to(i, &t, m, caller, run, now, rng),
                To::Node(_) => {}
                To::Subscribers => match t.what {
                    What::Unsubscribe => self.unsubscribe(caller, run, now),
                    _ => self.subscribe(&t, m, caller, run, now),
                },
            }
        }
    }

    /// Queues `t` on node `i`'s command connection (see [`step`](Self::step)).
    #[allow(clippy::too_many_arguments)]
    fn send_to<M: Machine>(
        &mut self,
        member: usize,
        t: &Transmit,
        m: &mut M,
        caller: CallerId,
        run: u64,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        let i = match self.topo[member] {
            None => member,
            Some(_) => match self.route(member, t, m, now) {
                Ok(link) => link,
                Err(why) => {
                    // No master serves the key's slot (the cluster electing one, its master
                    // marked failed): as on a node that is down, a compare-and-delete is kept
                    // for the member (on its seed link, which never serves a slot) and goes to
                    // the master the topology names next (see `reroute_retries`); anything
                    // else fails.
                    match (t.what, t.redo) {
                        (What::Acquire { token }, _) => self.nodes[member].unsent(token),
                        (What::Cleanup { token }, _) if self.nodes[member].was_unsent(token) => {}
                        (_, Some(until)) => self.retry_later(member, t, m, until),
                        _ => {}
                    }
                    if let Some(tag) = t.tag {
                        m.handle_failure(member, tag, why, now, rng);
                    }
                    return;
                }
            },
        };
        if let (None, What::Cleanup { token } | What::GiveBack { token }) = (t.tag, t.what) {
            if self.nodes[i].was_unsent(token) {
                // The attempt never went there: nothing of it to delete.
                return;
            }
        }
        if let (Some(tag), What::Release { token }) = (t.tag, t.what) {
            if self.gives_back(member) {
                if self.nodes[i].was_given(token) {
                    // The node answered the holder's give-back, the same compare-and-delete,
                    // on the connection it has now, which has not failed since: nothing of
                    // the holder is left there, and that answer is the release's.
                    self.mail.post_reply(caller, run, member, tag, b":1\r\n");
                    return;
                }
                let owner = (caller as u32, run, tag);
                let timeout = self.config.node_timeout;
                if self.nodes[i].cmd.adopt(token, owner, t.redo, now, timeout) {
                    // The give-back is on its way there: its answer is the release's.
                    return;
                }
            }
        }
        if let Some(why) = self.without_master(i) {
            // No master named yet: as on a node that is down, a compare-and-delete waits for
            // the next connection (to whichever master is named), anything else fails.
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            if let Some(until) = t.redo {
                self.retry_later(i, t, m, until);
            }
            if let Some(tag) = t.tag {
                m.handle_failure(member, tag, why, now, rng);
            }
            return;
        }
        let conn = &self.nodes[i].cmd;
        let Some(tag) = t.tag else {
            // Nobody reads its reply (a cleanup, a queue leave): it goes where something of
            // ours may be. A compare-and-delete for a node that cannot be sent to now waits for
            // its next connection.
            if !conn.can_send(now) {
                if let Some(until) = t.redo {
                    self.retry_later(i, t, m, until);
                }
                return;
            }
            // A compare-and-delete is never turned away for the backlog: it is what lets the
            // node drain, and what the backlog may have set there waits for it.
            if t.redo.is_none() && (conn.is_down() || conn.owed() >= MAX_OWED) {
                return;
            }
            self.connect_if_down(i, now);
            self.touch(ConnId {
                node: i,
                sub: false,
            });
            let caps = self.nodes[i].server.caps;
            let encoded = &mut self.encoded;
            let given = match t.what {
                What::GiveBack { token } => Some(token),
                _ => None,
            };
            self.nodes[i]
                .cmd
                .queue(Slot::Discard { redo: None, given }, t.redo, |out| {
                    encoded.write(caps, out, |out| m.encode(t, caps, out))
                });
            // A cleanup's first try has no `WAIT` of its own (every lost attempt sends one to
            // every node: a `WAIT` behind each would hold up the connection); it counts once
            // a later `WAIT` on its connection says so (see the `confirm` module). Sent again,
            // it has its own.
            self.keep_sent(i, false);
            return;
        };
        // A node whose setup was refused votes with that refusal until a setup goes through,
        // reconnecting or not: queued behind a new setup, the vote would come too late for
        // the round to see a configuration error, and a wait would end as contention.
        let refused = conn.setup_error().is_some();
        if !conn.can_send(now) || refused {
            if refused && conn.can_send(now) {
                // Its setup is tried again all the same: a fixed server is found again.
                self.connect_if_down(i, now);
            }
            let why = self.nodes[i].cmd.down_reason();
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            if let Some(until) = t.redo {
                // What the node may hold of ours is deleted once it is reachable again.
                self.retry_later(i, t, m, until);
            }
            m.handle_failure(member, tag, why, now, rng);
            return;
        }
        let backlog = t.redo.is_none() && conn.owed() >= MAX_OWED;
        if backlog || matches!(t.what, What::Acquire { .. }) && self.lagging(i, now) {
            // Behind a backlog that is already past the node timeout, a new acquisition would
            // only time out, and deepen the backlog: callers that win at the quorum without
            // this node would otherwise send it more than it can answer, without end. It
            // counts as timed out at once; releases and cleanups still go (but for the cleanup
            // of this very attempt, which has nothing to delete there).
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            m.handle_failure(member, tag, NodeErrorKind::Timeout, now, rng);
            return;
        }
        self.connect_if_down(i, now);
        let caps = self.nodes[i].server.caps;
        self.touch(ConnId {
            node: i,
            sub: false,
        });
        let encoded = &mut self.encoded;
        self.nodes[i].cmd.queue(
            Slot::Reply {
                caller: caller as u32,
                run,
                tag,
                sent: now,
                redo: None,
                due: timings::node_deadline(now, self.config.node_timeout),
                fired: false,
            },
            t.redo,
            |out| encoded.write(caps, out, |out| m.encode(t, caps, out)),
        );
        // Every write that must outlive a failover: grants, extends, downgrades, fence writes,
        // and releases (one acknowledged by the master alone is lost with it, and the key is
        // left on the replica promoted in its place).
        let wait = self.waits(member)
            && (t.redo.is_some()
                || matches!(
                    t.what,
                    What::Acquire { .. }
                        | What::Extend { .. }
                        | What::Downgrade { .. }
                        | What::FenceWrite { .. }
                ));
        self.keep_sent(i, wait);
        if wait {
            self.queue_wait(i);
        }
    }

    /// On a link of a cluster member, keeps the bytes of the command just queued (the last
    /// encoding) until its reply comes, to follow a redirection (with a `WAIT` after it if
    /// `wait`).
    fn keep_sent(&mut self, link: usize, wait: bool) {
        if self.topo[self.nodes[link].member].is_none() {
            return;
        }
        let before = self.encoded.for_caps.map_or(0, |(_, b)| b);
        self.nodes[link]
            .kept
            .push(&self.encoded.bytes, before, 0, wait);
    }

    /// Whether a give-back that member `member` answered stands for its holder's release
    /// there (see `What::GiveBack`): a plain node, whose writes count without a `WAIT` and
    /// whose master no sentinel may change (and not a cluster, whose slots may move).
    fn gives_back(&self, member: usize) -> bool {
        self.topo[member].is_none() && self.sentinels[member].is_none() && !self.waits(member)
    }

    /// Whether member `member`'s URL asks its writes to reach replicas (`?wait=N`) or
    /// append-only files (`?waitaof=L,R`) before they count.
    fn waits(&self, member: usize) -> bool {
        let node = &self.config.nodes[member];
        node.wait > 0 || node.waitaof.is_some()
    }

    /// Queues on `link`, after a grant (or a compare-and-delete), `WAIT N ms` for the
    /// replicas its member's URL asks a write to reach (`?wait=N`), then `WAITAOF L R ms` for
    /// the append-only fsyncs it asks for (`?waitaof=L,R`), each bounded by the node timeout:
    /// the command's reply is held until they answer, and counts only if every one says
    /// enough.
    fn queue_wait(&mut self, link: usize) {
        let node = &self.config.nodes[self.nodes[link].member];
        let ms = (self.config.node_timeout.as_millis() as u64).max(1);
        queue_waits(&mut self.nodes[link].cmd, node.wait, node.waitaof, ms);
    }

    /// Queues on node `i`'s command connection the compare-and-delete `bytes` owed there
    /// (`slot`, `redo`), with the waits after it that its member asks for: one sent again
    /// counts as delivered only once the replicas have it. One whose owner waits for its reply
    /// has its own; one nobody waits for (a cleanup, a release given up on) is confirmed by the
    /// next `WAIT` on the connection, as a cleanup's first try is (see the `confirm` module),
    /// and [`wait_after_owed`](Self::wait_after_owed) queues one after a batch of them: a
    /// `WAIT` behind each would hold up the new connection for as many node timeouts while the
    /// promoted master's replicas attach, and every grant queued behind them.
    fn queue_owed(&mut self, i: usize, slot: Slot, redo: Redo, bytes: &[u8]) {
        let member = self.nodes[i].member;
        let confirmed_later = self.waits(member) && matches!(slot, Slot::Discard { .. });
        self.nodes[i].unwaited |= confirmed_later;
        let wait = self.waits(member) && !confirmed_later;
        let ms = (self.config.node_timeout.as_millis() as u64).max(1);
        let (n, aof) = (
            self.config.nodes[member].wait,
            self.config.nodes[member].waitaof,
        );
        let node = &mut self.nodes[i];
        node.cmd.queue_redo(slot, redo, bytes);
        if self.topo[member].is_some() {
            node.kept.push(bytes, redo.before as usize, 0, wait);
        }
        if wait {
            queue_waits(&mut node.cmd, n, aof, ms);
            node.unwaited = false;
        }
    }

    /// Queues on node `i`'s command connection one `WAIT` (and `WAITAOF`) after the
    /// compare-and-deletes just queued again without one (see [`queue_owed`](Self::queue_owed)).
    fn wait_after_owed(&mut self, i: usize) {
        if !std::mem::take(&mut self.nodes[i].unwaited) {
            return;
        }
        self.queue_wait(i);
    }

    /// The link of cluster member `member` that `t` goes to: the master of the slot of its
    /// first key, as the slot map says; the seed link while no topology was read, or for a
    /// command without a key. A slot that the topology last read gives no master fails the
    /// member for this command, as the cluster would (`CLUSTERDOWN`).
    fn route<M: Machine>(
        &mut self,
        member: usize,
        t: &Transmit,
        m: &M,
        now: Instant,
    ) -> Result<usize, NodeErrorKind> {
        let caps = self.nodes[member].server.caps;
        self.scratch.clear();
        m.encode(t, caps, &mut self.scratch);
        let slot = cluster::first_key_slot(&self.scratch);
        self.refresh_if_due(member, now);
        let Some(topo) = &self.topo[member] else {
            return Ok(member);
        };
        match slot.map(|s| (s, topo.link(s))) {
            None => Ok(member),
            Some((_, Some(link))) => Ok(link),
            Some((_, None)) if !topo.known => Ok(member),
            Some((s, None)) => {
                // The cluster may be electing a new master for it: read again soon, and
                // until a master serves it (see `Topology::chase`).
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.chase(s, now);
                }
                Err(NodeErrorKind::Server {
                    kind: crate::resp::ServerErrorKind::ClusterDown,
                    message: format!(
                        "CLUSTERDOWN no master serves hash slot {s} in the cluster's topology"
                    ),
                })
            }
        }
    }

    /// The address of node `link`'s connections: a member's URL, or a cluster master's.
    pub fn node_addr(&self, link: usize) -> &NodeAddr {
        match &self.nodes[link].addr {
            Some(a) => a,
            None => &self.config.nodes[link],
        }
    }

    /// The address node `link`'s command connection is to (or was last to).
    fn link_target(&self, link: usize) -> Option<std::net::SocketAddr> {
        match self.node_addr(link).target(self.nodes[link].cmd.trying) {
            Target::Tcp(a) => Some(a),
            Target::Unix(_) => None,
        }
    }

    /// The link of cluster member `member` to the master at `addr`, added if there is none
    /// (in the place of a link given up, if there is one; its server taken to be what the
    /// member's seed said, until its setup says). `None` is never returned today: a member
    /// has as many links as its cluster has masters.
    fn link_for(
        &mut self,
        member: usize,
        addr: std::net::SocketAddr,
        now: Instant,
    ) -> Option<usize> {
        let found = (self.members..self.nodes.len()).find(|&l| {
            self.nodes[l].member == member
                && self.nodes[l]
                    .addr
                    .as_ref()
                    .is_some_and(|a| a.addrs[0] == addr)
        });
        if found.is_some() {
            return found;
        }
        let server = self.nodes[member].server;
        let node = Node {
            member,
            addr: Some(Box::new(self.config.nodes[member].master(addr))),
            kept: Kept::default(),
            awaiting: None,
            cmd: Conn::new(true, now),
            sub: Conn::new(false, now),
            server,
            known: false,
            retries: Vec::new(),
            retry_bytes: Vec::new(),
            again_at: None,
            again_backoff: BACKOFF_MIN,
            unsent: [None; UNSENT],
            unsent_next: 0,
            unconfirmed: Unconfirmed::default(),
            unwaited: false,
            given: [None; GIVEN],
            given_next: 0,
        };
        let link = match self.free.pop() {
            Some(l) => {
                self.nodes[l] = node;
                l
            }
            None => {
                self.nodes.push(node);
                self.channels.grow(self.nodes.len());
                self.nodes.len() - 1
            }
        };
        Some(link)
    }

    /// Whether node `i` is the place of a link given up: nothing is connected there.
    fn is_free(&self, i: usize) -> bool {
        i >= self.members && self.nodes[i].addr.is_none()
    }

    /// After a topology read of cluster member `member` (read on link `reading`), whose map
    /// names the links `in_use`: its other links to masters (not its seed link) are closed and
    /// their places freed for the next masters, once they owe nothing (no reply to a command,
    /// no compare-and-delete to send again or waiting for a `WAIT` to confirm it, no `WAIT`,
    /// no wake channel there and no subscription or unsubscription unconfirmed).
    /// A link that still owes is looked at again after the next read; so is `reading`, whose
    /// socket is being read. Without this, a master that changes address (a pod restarted with
    /// a new IP, a failover to a replacement node) would leave a link behind every time.
    fn reclaim_links(&mut self, member: usize, reading: usize, in_use: &Bits, now: Instant) {
        for l in self.members..self.nodes.len() {
            let node = &self.nodes[l];
            let idle = node.cmd.owed() == 0
                && !node.cmd.has_pending_output()
                && node.retries.is_empty()
                && node.awaiting.is_none()
                && !node.unconfirmed.owes_until(now)
                && !node.sub.has_pending_output()
                && !self.channels.uses(l, member);
            if node.member != member
                || self.is_free(l)
                || l == reading
                || in_use.contains(l)
                || !idle
            {
                continue;
            }
            for sub in [false, true] {
                let id = ConnId { node: l, sub };
                if self.is_open(id) {
                    self.io.push_back(Io::Close(id));
                }
            }
            // Confirmations its pub/sub connection owed will not come: nobody waits for them.
            self.channels.lost_subscriber(l, &mut self.mail);
            let node = &mut self.nodes[l];
            node.addr = None;
            node.kept.clear();
            node.unconfirmed = Unconfirmed::default();
            node.cmd = Conn::new(true, now);
            node.sub = Conn::new(false, now);
            node.server = Server::for_member(true);
            node.known = false;
            node.retry_bytes.clear();
            self.free.push(l);
        }
    }

    /// Sends a topology read of cluster member `member`: on its seed link if that is set up,
    /// else on a master's link that is, else on the seed link if it can take it (connecting
    /// it), else on any link that is up; if none can, it stays wanted.
    fn refresh(&mut self, member: usize, now: Instant) {
        let links = || (self.members..self.nodes.len()).filter(|&l| self.nodes[l].member == member);
        let link = if self.nodes[member].cmd.is_ready() {
            Some(member)
        } else if let Some(l) = links().find(|&l| self.nodes[l].cmd.is_ready()) {
            Some(l)
        } else if self.nodes[member].cmd.can_send(now) {
            Some(member)
        } else {
            links().find(|&l| self.nodes[l].cmd.is_up())
        };
        let Some(topo) = self.topo[member].as_mut() else {
            return;
        };
        topo.last = Some(now);
        topo.next = now + cluster::REFRESH_PERIOD;
        let Some(link) = link else {
            topo.want = true;
            return;
        };
        topo.want = false;
        topo.asked = Some(now);
        let slots_only = topo.slots_only;
        self.connect_if_down(link, now);
        self.nodes[link].cmd.queue(Slot::Topology, None, |out| {
            let what: &[u8] = if slots_only { b"SLOTS" } else { b"SHARDS" };
            crate::resp::encode_command(out, &[b"CLUSTER", what]);
            0
        });
        self.touch(ConnId {
            node: link,
            sub: false,
        });
    }

    /// A topology read's reply came on `link`: the member's slot map is what it says (or the
    /// older form is asked next, for a server without `CLUSTER SHARDS`). A server with cluster
    /// support disabled fails the link as a configuration error.
    fn read_topology(&mut self, link: usize, bytes: &[u8], now: Instant) {
        let member = self.nodes[link].member;
        let from = self.link_target(link);
        let tls = self.config.nodes[member].tls;
        let limits = self.config.limits;
        let Some(slots_only) = self.topo[member].as_ref().map(|t| t.slots_only) else {
            return;
        };
        let reply = cluster::decode(bytes, &limits);
        let ranges = match &reply {
            Some(Reply::Error(m)) if !slots_only && m.starts_with(b"ERR unknown subcommand") => {
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.slots_only = true;
                    topo.asked = None;
                }
                self.refresh(member, now);
                return;
            }
            Some(Reply::Error(m)) if m.windows(8).any(|w| w == b"disabled") => {
                let command = if slots_only {
                    "CLUSTER SLOTS"
                } else {
                    "CLUSTER SHARDS"
                };
                let why = NodeErrorKind::Setup {
                    command,
                    cause: Box::new(crate::engine::ops::server_error(m)),
                };
                let id = ConnId {
                    node: link,
                    sub: false,
                };
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
                return;
            }
            Some(r) if slots_only => cluster::parse_slots(r, from),
            Some(r) => cluster::parse_shards(r, tls, from),
            None => None,
        };
        let Some(ranges) = ranges else {
            if let Some(topo) = self.topo[member].as_mut() {
                topo.asked = None;
                topo.want = true;
            }
            return;
        };
        let linked: Vec<(u16, u16, Option<usize>)> = ranges
            .iter()
            .map(|&(a, b, addr)| (a, b, self.link_for(member, addr, now)))
            .collect();
        // A master's certificate is checked against the hostname the cluster announces for it,
        // where it announces one (from its next connect on).
        if let (false, Some(r)) = (slots_only, &reply) {
            for (addr, name) in cluster::shard_hostnames(r, tls, from) {
                let link = (self.members..self.nodes.len()).find(|&l| {
                    self.nodes[l].member == member
                        && self.nodes[l]
                            .addr
                            .as_ref()
                            .is_some_and(|a| a.addrs[0] == addr)
                });
                if let Some(a) = link.and_then(|l| self.nodes[l].addr.as_mut()) {
                    a.host = name;
                }
            }
        }
        if let Some(topo) = self.topo[member].as_mut() {
            topo.replace(&linked);
            topo.asked = None;
            topo.read(now);
        }
        // Every master in use is connected ahead of its first command, as members are.
        let mut in_use = Bits::with_room(self.nodes.len());
        for link in linked.iter().filter_map(|&(_, _, l)| l) {
            in_use.insert(link);
            self.connect_if_down(link, now);
        }
        // The cleanups a link no longer in the map ran and no `WAIT` confirmed go to the
        // masters that serve their slots now, as they would had its connection broken.
        for l in self.members..self.nodes.len() {
            let node = &mut self.nodes[l];
            if node.member == member && l != link && !in_use.contains(l) && node.cmd.owed() == 0 {
                let Node {
                    unconfirmed,
                    retries,
                    retry_bytes,
                    ..
                } = node;
                unconfirmed.drain(now, |redo, bytes| {
                    retry_bytes.extend_from_slice(bytes);
                    retries.push(Retry {
                        slot: Slot::Discard {
                            redo: None,
                            given: None,
                        },
                        redo,
                    });
                });
            }
        }
        self.reroute_retries(member, now);
        self.resubscribe(member, now);
        self.reclaim_links(member, link, &in_use, now);
    }

    /// The compare-and-deletes that the links of cluster member `member` keep for their next
    /// connection go to the master that serves their key's slot now, as the slot map says: a
    /// delete owed on a cluster member belongs to the member and the key's slot, not to the
    /// master it was first sent to (a master that died stays dead; its promoted replica, or
    /// the master the slot moved to, holds the key). The old connection broke on the server's
    /// side, so nothing sent on it can still run; on the new master, the delete goes behind
    /// whatever is queued there (an acquisition redirected there earlier included).
    fn reroute_retries(&mut self, member: usize, now: Instant) {
        let Some(topo) = self.topo[member].as_ref().filter(|t| t.known) else {
            return;
        };
        let mut moved: Vec<(usize, Retry, Vec<u8>)> = Vec::new();
        // A delete whose slot has no master yet (the cluster electing one): the topology is
        // read again soon, until one is named.
        let mut masterless = false;
        for l in 0..self.nodes.len() {
            let node = &mut self.nodes[l];
            if node.member != member || node.retries.is_empty() {
                continue;
            }
            let owner = |b: &[u8]| cluster::first_key_slot(b).and_then(|s| topo.link(s));
            let (mut at, mut elsewhere) = (0, false);
            for r in &node.retries {
                let end = at + r.redo.len as usize;
                let slot = cluster::first_key_slot(&node.retry_bytes[at..end]);
                at = end;
                if r.redo.until <= now {
                    continue;
                }
                match slot.map(|s| topo.link(s)) {
                    Some(Some(to)) => elsewhere |= to != l,
                    Some(None) => masterless = true,
                    None => {}
                }
            }
            if !elsewhere {
                continue;
            }
            let retries = std::mem::take(&mut node.retries);
            let bytes = std::mem::take(&mut node.retry_bytes);
            let mut at = 0;
            for r in retries {
                let end = at + r.redo.len as usize;
                let b = &bytes[at..end];
                at = end;
                match owner(b) {
                    Some(to) if to != l && r.redo.until > now => moved.push((to, r, b.to_vec())),
                    _ => {
                        node.retry_bytes.extend_from_slice(b);
                        node.retries.push(r);
                    }
                }
            }
        }
        if masterless {
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
        for (to, r, b) in moved {
            let node = &mut self.nodes[to];
            if node.cmd.is_down() {
                // Sent first thing on its next connection, started below.
                node.retry_bytes.extend_from_slice(&b);
                node.retries.push(r);
                continue;
            }
            // Its owner, if it still waits, hears from the new master.
            self.queue_owed(to, r.slot.resent(now), r.redo, &b);
            self.wait_after_owed(to);
            self.touch(ConnId {
                node: to,
                sub: false,
            });
        }
        for l in 0..self.nodes.len() {
            if self.nodes[l].member == member && !self.nodes[l].retries.is_empty() {
                self.connect_if_down(l, now);
            }
        }
    }

    /// Follows a redirection read on `from` (see the module docs of `cluster`): `MOVED` moves
    /// the slot in the map and asks for a topology read; the command is sent to the node named
    /// (after `ASKING` for `ASK`) within its node timeout, a compare-and-delete until what it
    /// deletes expires. Otherwise (no such node, too many hops, too late) the owner is given
    /// the redirection as the reply, a failure of that member: never a vote.
    fn follow(&mut self, from: usize, r: Redirected, now: Instant) {
        let member = self.nodes[from].member;
        let target = r.to.to.and_then(|a| self.link_for(member, a, now));
        if let Some(topo) = self.topo[member].as_mut() {
            if !r.to.ask {
                if let Some(t) = target {
                    topo.set(r.to.slot, t);
                }
                topo.want = true;
            }
        }
        let redo = match r.slot {
            Slot::Reply { redo, .. } | Slot::Discard { redo, .. } => redo,
            _ => None,
        };
        let worth = match (redo, r.slot) {
            (Some(redo), _) => redo.until > now,
            // An acquisition only while its round waits for it: once the round is over (its
            // owner may have released already), sending it again could only leave a key behind.
            (
                None,
                Slot::Reply {
                    caller,
                    run,
                    due,
                    fired,
                    ..
                },
            ) => !fired && due > now && self.mail.run_of(caller as usize) == Some(run),
            _ => false,
        };
        let to = target
            .filter(|&t| worth && r.hops < cluster::MAX_HOPS && self.nodes[t].cmd.can_send(now));
        let Some(to) = to else {
            // A compare-and-delete for a master in its reconnect backoff waits for its next
            // connection, as on any node.
            let waits = target.filter(|&t| worth && !self.nodes[t].cmd.can_send(now));
            if let (Some(t), Some(redo)) = (waits, redo) {
                let node = &mut self.nodes[t];
                node.retry_bytes.extend_from_slice(&r.bytes);
                node.retries.push(Retry {
                    slot: Slot::Discard {
                        redo: None,
                        given: None,
                    },
                    redo: Redo {
                        until: redo.until,
                        len: r.bytes.len() as u32,
                        before: r.before as u32,
                    },
                });
            }
            if let Slot::Reply {
                caller, run, tag, ..
            } = r.slot
            {
                self.mail
                    .post_reply(caller as usize, run, member, tag, &r.reply);
            }
            return;
        };
        self.connect_if_down(to, now);
        let mut bytes = Vec::with_capacity(r.bytes.len() + 16);
        let mut before = r.before;
        if r.to.ask {
            crate::resp::encode_command(&mut bytes, &[b"ASKING"]);
            before += 1;
        }
        bytes.extend_from_slice(&r.bytes);
        self.nodes[to]
            .cmd
            .queue(r.slot, redo.map(|r| r.until), |out| {
                out.extend_from_slice(&bytes);
                before
            });
        self.nodes[to].kept.push(&bytes, before, r.hops + 1, r.wait);
        if r.wait {
            self.queue_wait(to);
        }
        self.touch(ConnId {
            node: to,
            sub: false,
        });
    }

    /// The compare-and-deletes that node `i` answered without running them stay owed, as long
    /// as what they delete may still be there: one answered `NOSCRIPT` goes again at once with
    /// its script's body; one refused for a while (`BUSY`, `TRYAGAIN`, `LOADING`) goes again
    /// after a short backoff that doubles while the node refuses (see
    /// [`handle_timeout`](Self::handle_timeout)). An owner still waiting gets the reply that
    /// is finally given, or its node timeout, as for a release kept after a broken
    /// connection; one not sent again (expired, or nothing to rewrite) gives its owner the
    /// reply as it came.
    ///
    /// A compare-and-delete that ran, but that the replicas (or fsyncs) its member asks for
    /// did not acknowledge in time ([`Refused::Unacknowledged`]), is not sent again on that
    /// connection (the master has run it): a later `WAIT` there confirms it, as a cleanup's
    /// (see the `confirm` module); it goes again on the node's next connection if this one
    /// breaks first, as one of a broken connection.
    ///
    /// While the client closes, replies that were all such refusals (`idle` of those read) are
    /// no progress: a node that refuses what it owes for as long as closing waits is one it
    /// gives up on.
    fn owe_again(
        &mut self,
        i: usize,
        refusals: Vec<Refusal>,
        idle: u64,
        was: Option<(Instant, u64)>,
        now: Instant,
    ) {
        if let (Some(c), Some((progress, read))) = (&mut self.closing, was) {
            if idle > 0 && self.nodes[i].cmd.read - read <= idle {
                c.progress = progress;
            }
        }
        if refusals.is_empty() {
            return;
        }
        let member = self.nodes[i].member;
        let mut refused = false;
        for r in refusals {
            let Some(mut redo) = r.slot.redo() else {
                continue;
            };
            // The refusal comes after the node ran every command written before it on this
            // connection, a lock's write that a node slow for its load ran late among them:
            // what it deletes may live on from now for as long as it was worth sending from
            // when it was sent.
            if let Slot::Reply { sent, .. } = r.slot {
                redo.until = redo
                    .until
                    .max(now + redo.until.saturating_duration_since(sent));
            }
            let bytes = match r.kind {
                // Sent again once, with its body: no `NOSCRIPT` can follow, and what it
                // deletes may have been written late, after the time it was kept for.
                Refused::NoScript => conn::with_bodies(&r.command),
                _ if redo.until <= now => None,
                Refused::Transient | Refused::Unacknowledged => Some(r.command),
            };
            let Some(bytes) = bytes else {
                if let Slot::Reply {
                    caller, run, tag, ..
                } = r.slot
                {
                    self.mail
                        .post_reply(caller as usize, run, member, tag, &r.reply);
                }
                continue;
            };
            let redo = Redo {
                len: bytes.len() as u32,
                before: r.before as u32,
                ..redo
            };
            // It ran on this connection, which is still up: a later `WAIT` on it confirms it
            // (see the `confirm` module).
            if r.kind == Refused::Unacknowledged && self.nodes[i].cmd.is_up() {
                self.nodes[i].unconfirmed.push_short(redo, &bytes, now);
                continue;
            }
            if r.kind == Refused::NoScript && self.nodes[i].cmd.is_up() {
                self.queue_owed(i, r.slot, redo, &bytes);
                self.wait_after_owed(i);
                self.touch(ConnId {
                    node: i,
                    sub: false,
                });
                continue;
            }
            let node = &mut self.nodes[i];
            node.retry_bytes.extend_from_slice(&bytes);
            node.retries.push(Retry { slot: r.slot, redo });
            refused |= r.kind == Refused::Transient;
        }
        // (Those kept for a connection that broke meanwhile go on its next one.)
        let node = &mut self.nodes[i];
        if refused && node.again_at.is_none() {
            node.again_at = Some(now + node.again_backoff);
            node.again_backoff = (node.again_backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Keeps the compare-and-delete `t` for node `i`'s next connection.
    fn retry_later<M: Machine>(&mut self, i: usize, t: &Transmit, m: &M, until: Instant) {
        let node = &mut self.nodes[i];
        let caps = node.server.caps;
        let start = node.retry_bytes.len();
        let before = self
            .encoded
            .write(caps, &mut node.retry_bytes, |out| m.encode(t, caps, out));
        node.retries.push(Retry {
            slot: Slot::Discard {
                redo: None,
                given: None,
            },
            redo: Redo {
                until,
                len: (node.retry_bytes.len() - start) as u32,
                before: before as u32,
            },
        });
    }

    /// Whether node `i`'s command connection still owes a reply to a command queued more than
    /// the node timeout ago. (The shell reads what has come first: see
    /// [`late_nodes`](Self::late_nodes).)
    fn lagging(&self, i: usize, now: Instant) -> bool {
        self.nodes[i]
            .cmd
            .oldest_reply_since()
            .is_some_and(|sent| now.saturating_duration_since(sent) >= self.config.node_timeout)
    }

    /// The nodes whose command connection owes a reply older than the node timeout, into
    /// `into` (emptied first): a shell that reads only when someone waits should read those
    /// before a caller steps, so that replies that came but were not read yet do not make an
    /// acquisition skip them.
    pub fn late_nodes(&self, now: Instant, into: &mut Bits) {
        into.clear();
        for i in (0..self.nodes.len()).filter(|&i| self.lagging(i, now)) {
            into.insert(i);
        }
    }

    /// Starts a connection to node `i` for commands if it is down and due, with the
    /// compare-and-deletes of its broken connections first behind the setup.
    fn connect_if_down(&mut self, i: usize, now: Instant) {
        // The connection's own state first: it is up on nearly every call.
        let cmd = &self.nodes[i].cmd;
        if !cmd.is_down() || !cmd.can_send(now) {
            return;
        }
        if self.is_free(i) || self.without_master(i).is_some() {
            return;
        }
        let node = &mut self.nodes[i];
        let why = node.cmd.down_reason();
        let addr = match &node.addr {
            Some(a) => a,
            None => &self.config.nodes[i],
        };
        node.cmd.start(addr, self.topo[node.member].is_some(), now);
        self.dirty.insert(
            ConnId {
                node: i,
                sub: false,
            }
            .index(),
        );
        self.io.push_back(Io::Connect(ConnId {
            node: i,
            sub: false,
        }));
        self.requeue(i, why, now);
    }

    /// Queues on node `i`'s command connection (up, or just started) the compare-and-deletes
    /// kept for it, those still worth sending; the owners still waiting for the others hear
    /// `why` they were not sent.
    fn requeue(&mut self, i: usize, why: NodeErrorKind, now: Instant) {
        let node = &mut self.nodes[i];
        node.again_at = None;
        let member = node.member;
        if i == member && self.topo[member].as_ref().is_some_and(|t| t.known) {
            // A cluster member's seed link keeps what no master serves yet: it goes to the
            // master the topology names (see `reroute_retries`), never to whichever node the
            // seed reaches (a replica, or a master that would redirect it to the dead one).
            return;
        }
        let mut retries = std::mem::take(&mut node.retries);
        let mut bytes = std::mem::take(&mut node.retry_bytes);
        let mut at = 0;
        for r in &retries {
            let end = at + r.redo.len as usize;
            if r.redo.until > now {
                // Written on the new connection, it gets a node timeout from then on.
                self.queue_owed(i, r.slot.resent(now), r.redo, &bytes[at..end]);
            } else if let Slot::Reply {
                caller,
                run,
                tag,
                fired: false,
                ..
            } = r.slot
            {
                // Not sent again (what it deletes has expired anyway), but its owner may still
                // wait: it hears why the node could not be reached.
                self.mail.post(
                    caller as usize,
                    run,
                    Event::Failure {
                        node: member,
                        tag,
                        why: why.clone(),
                    },
                );
            }
            at = end;
        }
        self.wait_after_owed(i);
        // Nothing was kept meanwhile: the buffers are reused.
        retries.clear();
        bytes.clear();
        let node = &mut self.nodes[i];
        node.retries = retries;
        node.retry_bytes = bytes;
    }

    // --- I/O -----------------------------------------------------------------------------

    /// Every command connection that is down and due starts connecting: a client warms its
    /// connections up before its first lock.
    pub fn connect_all(&mut self, now: Instant) {
        for i in 0..self.nodes.len() {
            self.connect_if_down(i, now);
        }
        for member in 0..self.members {
            self.refresh_if_due(member, now);
        }
    }

    /// The connections that may have bytes to write since the last call (by
    /// [`ConnId::index`]), into `into` (emptied first; the two sets trade places, so neither
    /// allocates once both have room): the shell writes those (a connection whose socket
    /// does not take everything at once asks to be written again when it is writable).
    pub fn take_dirty(&mut self, into: &mut Bits) {
        into.clear();
        std::mem::swap(&mut self.dirty, into);
    }

    fn touch(&mut self, id: ConnId) {
        self.dirty.insert(id.index());
    }

    /// The next system call to make.
    pub fn poll_io(&mut self) -> Option<Io> {
        self.io.pop_front()
    }

    fn conn(&mut self, id: ConnId) -> &mut Conn {
        let node = &mut self.nodes[id.node];
        if id.sub {
            &mut node.sub
        } else {
            &mut node.cmd
        }
    }

    /// Whether the connection has a socket (connected or connecting).
    pub fn is_open(&self, id: ConnId) -> bool {
        let node = &self.nodes[id.node];
        !if id.sub { &node.sub } else { &node.cmd }.is_down()
    }

    /// The connect of `id` finished.
    pub fn handle_connected(&mut self, id: ConnId) {
        self.conn(id).connected();
    }

    /// The stream of `id` is connected, and its TLS handshake goes on: should the handshake
    /// still be unanswered at the connect timeout, the node is no TLS server (see
    /// [`handle_timeout`](Self::handle_timeout)).
    pub fn handle_linked(&mut self, id: ConnId) {
        self.conn(id).linked();
    }

    /// The address the connect of `id` is to.
    pub fn connect_addr(&self, id: ConnId) -> Target<'_> {
        let node = &self.nodes[id.node];
        let trying = if id.sub { &node.sub } else { &node.cmd }.trying;
        self.node_addr(id.node).target(trying)
    }

    /// The name TLS checks the certificate against on the connect of `id`: the host of the
    /// address tried (a cluster seed's own), or the name a cluster master goes by.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub fn tls_name(&self, id: ConnId) -> &str {
        let node = &self.nodes[id.node];
        let trying = if id.sub { &node.sub } else { &node.cmd }.trying;
        self.node_addr(id.node).tls_name(trying)
    }

    /// The connect of `id` failed with `why` at `now` (its socket, if any, is closed): the
    /// node's next address is tried (another [`Io::Connect`]), or, when none is left, the
    /// connection fails. A configuration error (a TLS handshake that failed) fails it at once:
    /// another address of the same name would not cure it. But for a cluster's seeds, other
    /// servers each checked against its own name: the next one is tried.
    pub fn handle_connect_failed(&mut self, id: ConnId, why: NodeErrorKind, now: Instant) {
        let addresses = self.node_addr(id.node).targets();
        let config = matches!(why, NodeErrorKind::Setup { .. });
        let seed = id.node < self.members && self.topo[id.node].is_some();
        if (!config || seed) && self.conn(id).next_address(addresses, now) {
            self.io.push_back(Io::Connect(id));
        } else {
            self.fail(id, why, now);
        }
    }

    /// The bytes `id` has to write.
    pub fn pending(&self, id: ConnId) -> &[u8] {
        let node = &self.nodes[id.node];
        if id.sub { &node.sub } else { &node.cmd }.pending()
    }

    /// Whether `id` has bytes to write.
    pub fn wants_write(&self, id: ConnId) -> bool {
        let node = &self.nodes[id.node];
        if id.sub { &node.sub } else { &node.cmd }.has_pending_output()
    }

    /// `n` bytes of [`pending`](Self::pending) were written to `id` at `now`. Once all of it
    /// is, the node timeout of each command that left counts from now.
    pub fn handle_sent(&mut self, id: ConnId, n: usize, now: Instant) {
        let node_timeout = self.config.node_timeout;
        let conn = self.conn(id);
        conn.sent(n);
        if !id.sub {
            conn.mark_written(now, node_timeout);
        }
    }

    /// Space to read `id`'s incoming bytes into; report what was read with
    /// [`handle_recv`](Self::handle_recv). An error means the connection cannot take more (a
    /// reply bigger than the codec accepts): it is failed, and its socket should be closed.
    pub fn recv_buf(&mut self, id: ConnId, now: Instant) -> Option<&mut [u8]> {
        let limits = self.config.limits;
        if let Err(why) = self.conn(id).make_room(&limits) {
            self.fail(id, why, now);
            self.io.push_back(Io::Close(id));
            return None;
        }
        Some(self.conn(id).spare())
    }

    /// `n` bytes were read into [`recv_buf`](Self::recv_buf) of `id` at `now`: every complete
    /// reply is routed to its caller (or, on a pub/sub connection, every message to the
    /// callers of its channel).
    pub fn handle_recv(&mut self, id: ConnId, n: usize, now: Instant) {
        self.conn(id).received(n);
        let was = self.closing.map(|c| (c.progress, self.conn(id).read));
        let limits = self.config.limits;
        let i = id.node;
        let member = self.nodes[i].member;
        if !id.sub && self.topo[member].is_some() {
            return self.handle_recv_cluster(i, was, now);
        }
        if self.is_sentinel_link(i) {
            return match id.sub {
                false => self.sentinel_recv(i, now),
                true => self.sentinel_push(i, now),
            };
        }
        if let Some(c) = &mut self.closing {
            c.progress = now;
        }
        let mut pushes = Vec::new();
        let mut refusals = Vec::new();
        let mut idle = 0;
        let mut readonly = false;
        let result = if id.sub {
            let channels = &mut self.channels;
            let mail = &mut self.mail;
            self.nodes[i].sub.take_replies(&limits, |_, bytes, _, _| {
                match channels.handle_push(i, member, bytes, &limits, mail) {
                    Push::Nothing => {}
                    push => pushes.push(push),
                }
            })
        } else {
            let mail = &mut self.mail;
            let stats = &self.stats;
            let refusals = &mut refusals;
            let idle = &mut idle;
            let wants = (
                self.config.nodes[member].wait,
                self.config.nodes[member].waitaof,
            );
            let confirms = wants.0 > 0 || wants.1.is_some();
            let sentinel = self.sentinels[member].is_some();
            // A give-back answered here stands for its holder's release only where a write
            // counts without a `WAIT` and no sentinel may name another master.
            let plain = !sentinel && wants.0 == 0 && wants.1.is_none();
            let readonly = &mut readonly;
            let Node {
                cmd,
                again_backoff,
                awaiting,
                unconfirmed,
                given,
                given_next,
                ..
            } = &mut self.nodes[i];
            cmd.take_replies(&limits, |slot, bytes, command, waits| {
                // A master named by sentinels that refuses writes as a replica was demoted:
                // they are asked again, and what it refused goes to the master they name.
                let demoted = sentinel && bytes.starts_with(b"-READONLY");
                *readonly |= demoted;
                // A compare-and-delete nobody waits for, on a member that waits for replicas:
                // done once a `WAIT` after it says so, its own or a later one.
                let confirmed_later = confirms && matches!(slot, Slot::Discard { .. });
                if let Some(redo) = slot.redo() {
                    match Refused::of(bytes).or(demoted.then_some(Refused::Transient)) {
                        Some(kind) => {
                            *idle += 1;
                            return refusals.push(Refusal {
                                slot,
                                kind,
                                command: command.to_vec(),
                                before: redo.before as usize,
                                reply: bytes.to_vec(),
                            });
                        }
                        // One the replicas must acknowledge is not done yet.
                        None if confirmed_later => {
                            *again_backoff = BACKOFF_MIN;
                            unconfirmed.push(redo, command);
                        }
                        None if waits => {}
                        None => *again_backoff = BACKOFF_MIN,
                    }
                }
                if let Slot::Discard {
                    given: Some(token), ..
                } = slot
                {
                    // It ran: an integer (it deleted the key, or found it gone), or the
                    // transaction's with `DELEX`'s integer first.
                    let ran = bytes.starts_with(b":") || bytes.starts_with(b"*2\r\n:");
                    if ran && plain && !waits {
                        given[*given_next] = Some(token);
                        *given_next = (*given_next + 1) % GIVEN;
                    }
                }
                match slot {
                    Slot::Discard { redo: Some(_), .. } if confirmed_later => {}
                    // A write's reply counts once its `WAIT` says enough replicas have it.
                    Slot::Reply { .. } | Slot::Discard { .. } if waits => {
                        *awaiting = Some(Awaiting::new(slot, bytes, command))
                    }
                    wait_slot @ (Slot::Wait | Slot::WaitAof) => {
                        *idle += answer_wait(
                            awaiting,
                            Waited {
                                bytes,
                                slot: wait_slot,
                                more: waits,
                                wants,
                                member,
                                now,
                            },
                            &limits,
                            stats,
                            mail,
                            refusals,
                            again_backoff,
                            unconfirmed,
                        );
                    }
                    Slot::Reply {
                        caller,
                        run,
                        tag,
                        sent,
                        ..
                    } => {
                        // Every reply is timed, the late ones too: a round decided at the
                        // quorum must not hide the slowest node's latency.
                        stats.reply(i, now.saturating_duration_since(sent));
                        mail.post_reply(caller as usize, run, i, tag, bytes);
                    }
                    _ => {}
                }
            })
        };
        match result {
            Ok(false) => {}
            Ok(true) if id.sub => {
                self.nodes[i].sub.release_held();
                self.touch(id);
            }
            Ok(true) => self.set_up(i, now),
            Err(why) => {
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
            }
        }
        for push in pushes {
            self.handle_sharded_push(i, push, now);
        }
        self.owe_again(i, refusals, idle, was, now);
        if readonly && !self.nodes[i].cmd.is_down() {
            let why = NodeErrorKind::Server {
                kind: crate::resp::ServerErrorKind::ReadOnly,
                message: "READONLY the master the sentinels named is a replica now".to_owned(),
            };
            self.fail(id, why, now);
            self.io.push_back(Io::Close(id));
        }
        if !id.sub {
            self.confirm_if_idle(i, now);
        }
    }

    /// [`handle_recv`](Self::handle_recv) for the command connection of `link`, a link of a
    /// cluster member: redirections are followed, topology replies read, and every other
    /// reply is routed to its caller as the member's.
    fn handle_recv_cluster(&mut self, link: usize, was: Option<(Instant, u64)>, now: Instant) {
        let limits = self.config.limits;
        let member = self.nodes[link].member;
        let from = self.link_target(link);
        let mut topology: Vec<Vec<u8>> = Vec::new();
        let mut redirected: Vec<Redirected> = Vec::new();
        let mut refusals: Vec<Refusal> = Vec::new();
        let mut idle = 0;
        let wants = (
            self.config.nodes[member].wait,
            self.config.nodes[member].waitaof,
        );
        let mut down = false;
        // Anything but a topology read answered: the nodes move on with what they owe.
        let mut progress = false;
        let mail = &mut self.mail;
        let stats = &self.stats;
        let confirms = wants.0 > 0 || wants.1.is_some();
        let Node {
            cmd,
            kept,
            awaiting,
            again_backoff,
            unconfirmed,
            ..
        } = &mut self.nodes[link];
        let idle_reads = &mut idle;
        let result = cmd.take_replies(&limits, |slot, bytes, _, waits| match slot {
            Slot::Topology => topology.push(bytes.to_vec()),
            // After a redirection, nothing waits for it.
            wait_slot @ (Slot::Wait | Slot::WaitAof) => {
                progress = true;
                *idle_reads += answer_wait(
                    awaiting,
                    Waited {
                        bytes,
                        slot: wait_slot,
                        more: waits,
                        wants,
                        member,
                        now,
                    },
                    &limits,
                    stats,
                    mail,
                    &mut refusals,
                    again_backoff,
                    unconfirmed,
                );
            }
            Slot::Reply { .. } | Slot::Discard { .. } => {
                progress = true;
                let command = kept.pop();
                down |= bytes.starts_with(b"-CLUSTERDOWN");
                let to = if bytes.first() == Some(&b'-') {
                    cluster::redirect(bytes, from)
                } else {
                    None
                };
                let confirmed_later = confirms && matches!(slot, Slot::Discard { .. });
                if let (Some((b, before, _, wait)), Some(redo)) = (command, slot.redo()) {
                    match Refused::of(bytes) {
                        Some(kind) => {
                            *idle_reads += 1;
                            return refusals.push(Refusal {
                                slot,
                                kind,
                                command: b.to_vec(),
                                before,
                                reply: bytes.to_vec(),
                            });
                        }
                        // One the replicas must acknowledge is not done yet: nobody waits for
                        // it, so a `WAIT` after it says when, its own or a later one.
                        None if to.is_none() && confirmed_later => {
                            *again_backoff = BACKOFF_MIN;
                            unconfirmed.push(redo, b);
                        }
                        None if to.is_none() && !wait => *again_backoff = BACKOFF_MIN,
                        None => {}
                    }
                }
                if let (Some((b, before, hops, wait)), Some(to)) = (command, to) {
                    redirected.push(Redirected {
                        to,
                        slot,
                        bytes: b.to_vec(),
                        before,
                        hops,
                        wait,
                        reply: bytes.to_vec(),
                    });
                    return;
                }
                if let Some((b, _, _, true)) = command {
                    if !(confirmed_later && slot.redo().is_some()) {
                        *awaiting = Some(Awaiting::new(slot, bytes, b));
                    }
                    return;
                }
                if let Slot::Reply {
                    caller,
                    run,
                    tag,
                    sent,
                    ..
                } = slot
                {
                    stats.reply(member, now.saturating_duration_since(sent));
                    mail.post_reply(caller as usize, run, member, tag, bytes);
                }
            }
            _ => {}
        });
        let id = ConnId {
            node: link,
            sub: false,
        };
        if progress || matches!(result, Ok(true)) {
            if let Some(c) = &mut self.closing {
                c.progress = now;
            }
        }
        match result {
            Ok(false) => {}
            Ok(true) => self.set_up(link, now),
            Err(why) => {
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
            }
        }
        for bytes in topology {
            self.read_topology(link, &bytes, now);
        }
        for r in redirected {
            self.follow(link, r, now);
        }
        self.owe_again(link, refusals, idle, was, now);
        if down {
            // The cluster is electing a master, or lost a slot's: read again soon.
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
        self.confirm_if_idle(link, now);
        self.refresh_if_due(member, now);
    }

    /// Sends on node `i`'s command connection a `WAIT` (and `WAITAOF`) of the endpoint's own
    /// for the cleanups it ran that no `WAIT` confirmed, once it is idle (see the `confirm`
    /// module). It waits a quarter of the node timeout at most: a grant queued behind it still
    /// has its reply within its own.
    fn confirm_if_idle(&mut self, i: usize, now: Instant) {
        let node = &mut self.nodes[i];
        if !node.unconfirmed.wants_wait(&node.cmd, now) {
            return;
        }
        let member = &self.config.nodes[node.member];
        let ms = (self.config.node_timeout.as_millis() as u64 / 4).max(1);
        queue_waits(&mut node.cmd, member.wait, member.waitaof, ms);
        self.touch(ConnId {
            node: i,
            sub: false,
        });
    }

    /// Sends a topology read of cluster member `member` if one is due (none is under way, or
    /// the one under way went unanswered for too long).
    fn refresh_if_due(&mut self, member: usize, now: Instant) {
        self.sentinels_if_due(member, now);
        let due = self.topo[member]
            .as_ref()
            .is_some_and(|t| t.due().is_some_and(|d| d <= now));
        if due {
            self.refresh(member, now);
        }
    }

    /// Node `i`'s command connection has answered its whole setup: the node's server is what
    /// it said, and what waited behind the setup goes out (see the module docs for what a
    /// changed server and a duplicate one mean).
    fn set_up(&mut self, i: usize, now: Instant) {
        let mut learnt = self.nodes[i].cmd.learnt;
        learnt.caps.sharded = self.topo[self.nodes[i].member].is_some();
        // The links of one cluster member may reach one server twice (its seed link and a
        // master's); servers of two members may not be one.
        let member = self.nodes[i].member;
        let twin = learnt.run_id.and_then(|id| {
            (0..self.nodes.len()).find(|&j| {
                self.nodes[j].member != member && self.nodes[j].server.run_id == Some(id)
            })
        });
        let id = ConnId {
            node: i,
            sub: false,
        };
        if let Some(j) = twin {
            let node = self.nodes[j].member;
            let why = Setup::Info.failed(NodeErrorKind::SameServer { node });
            self.fail(id, why, now);
            self.io.push_back(Io::Close(id));
            return;
        }
        let changed = learnt.caps != self.nodes[i].server.caps;
        self.nodes[i].server = learnt;
        self.nodes[i].known = true;
        if changed && self.nodes[i].cmd.holds_fresh_commands() {
            // Written for the server the node was: they must not run on the one it is.
            self.fail(id, NodeErrorKind::ServerChanged, now);
            self.io.push_back(Io::Close(id));
            return;
        }
        self.nodes[i].cmd.release_held();
        self.touch(id);
    }

    /// The connection `id` failed with `why` at `now` (its socket is closed, or to be closed):
    /// every reply it owed fails for its owner, but for the compare-and-deletes, which are
    /// kept for the node's next connection.
    ///
    /// A TCP connection that its server closed before answering anything, to a node that
    /// never answered a setup, may say that the configuration is wrong: a plaintext
    /// connection may have reached a TLS port, which closes it at the first plaintext bytes; a
    /// TLS server may refuse this client's certificate once the handshake is over, and its
    /// alert is lost when it closes the connection with our first commands unread. Its failure
    /// then waits for a probe ([`Io::Probe`]). A node that answered before is not probed (the
    /// probe blocks): a configuration error shows from the first connect.
    pub fn handle_failed(&mut self, id: ConnId, why: NodeErrorKind, now: Instant) {
        let closed = matches!(
            why,
            NodeErrorKind::Io(
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::BrokenPipe
            )
        );
        let node = &self.nodes[id.node];
        let conn = if id.sub { &node.sub } else { &node.cmd };
        let unheard = conn.is_up() && !conn.heard && !node.known;
        if closed && unheard && matches!(self.connect_addr(id), Target::Tcp(_)) {
            let timeout = self.config.connect_timeout.min(PROBE_LIMIT);
            self.probing.push((id, why));
            self.io.push_back(Io::Probe { id, timeout });
            return;
        }
        self.fail(id, why, now);
    }

    /// The probe of `id` ([`Io::Probe`]) found `found`: the connection fails, with a
    /// configuration error if that is what the probe found.
    pub fn handle_probed(&mut self, id: ConnId, found: Probed, now: Instant) {
        let Some(k) = self.probing.iter().position(|(p, _)| *p == id) else {
            return;
        };
        let (_, why) = self.probing.swap_remove(k);
        let why = match (found, self.node_addr(id.node).tls) {
            (Probed::AnswersTls, false) => NodeErrorKind::Setup {
                command: "TLS",
                cause: Box::new(NodeErrorKind::Tls(TlsFailure::TlsPort)),
            },
            (Probed::Refused(refusal), true) => refusal,
            _ => why,
        };
        self.fail(id, why, now);
    }

    fn fail(&mut self, id: ConnId, why: NodeErrorKind, now: Instant) {
        let i = id.node;
        if self.is_sentinel_link(i) {
            return match id.sub {
                false => self.sentinel_failed(i, why, now),
                true => self.sentinel_sub_failed(i, why, now),
            };
        }
        if !id.sub && i < self.members {
            // A master named by sentinels: they are asked again.
            self.suspect_master(i, now);
        }
        if id.sub {
            let node = &mut self.nodes[i];
            node.sub.fail(why, now, |_, _| {});
            self.channels.lost_subscriber(i, &mut self.mail);
            if let Some(topo) = self.topo[self.nodes[i].member].as_mut() {
                // Its channels are subscribed to again after the next topology read, at
                // whichever masters own their slots then.
                topo.want = true;
            }
            return;
        }
        let member = self.nodes[i].member;
        if self.nodes[i].cmd.is_up() {
            self.stats.disconnect(member);
        }
        // What this connection answered says nothing of the next one's server (a restart, a
        // failover): every release goes there again.
        self.nodes[i].given = [None; GIVEN];
        if let Some(topo) = self.topo[member].as_mut() {
            // A topology read on it is lost, and the cluster may have changed.
            topo.asked = None;
            topo.want = true;
        }
        let Node {
            cmd,
            retries,
            retry_bytes,
            kept,
            awaiting,
            unconfirmed,
            ..
        } = &mut self.nodes[i];
        kept.clear();
        // The cleanups it ran that no `WAIT` confirmed go again, with theirs, on the next
        // connection (to the master promoted in a failover, which may not have had them).
        unconfirmed.drain(now, |redo, bytes| {
            retry_bytes.extend_from_slice(bytes);
            retries.push(Retry {
                slot: Slot::Discard {
                    redo: None,
                    given: None,
                },
                redo,
            });
        });
        if let Some(a) = awaiting.take() {
            // Its `WAIT` will not answer: the write does not count.
            if let Slot::Reply {
                caller, run, tag, ..
            } = a.slot
            {
                self.mail.post(
                    caller as usize,
                    run,
                    Event::Failure {
                        node: member,
                        tag,
                        why: why.clone(),
                    },
                );
            }
            // A compare-and-delete stays owed, first of those of this connection.
            if let Some(redo) = a.slot.redo().filter(|r| r.until > now) {
                retry_bytes.extend_from_slice(&a.command);
                retries.push(Retry {
                    slot: Slot::Discard {
                        redo: None,
                        given: None,
                    },
                    redo: Redo {
                        len: a.command.len() as u32,
                        ..redo
                    },
                });
            }
        }
        let mail = &mut self.mail;
        cmd.fail(why.clone(), now, |slot, bytes| {
            let redo = match slot {
                Slot::Reply { redo, .. } | Slot::Discard { redo, .. } => redo,
                _ => None,
            };
            match (redo.filter(|r| r.until > now), bytes) {
                // Sent again on the next connection; its owner, if it still waits, gets
                // that reply.
                (Some(redo), Some(bytes)) => {
                    retry_bytes.extend_from_slice(bytes);
                    retries.push(Retry { slot, redo });
                }
                _ => {
                    if let Slot::Reply {
                        caller, run, tag, ..
                    } = slot
                    {
                        mail.post(
                            caller as usize,
                            run,
                            Event::Failure {
                                node: member,
                                tag,
                                why: why.clone(),
                            },
                        );
                    }
                }
            }
        });
        // The slot map may have moved their slots already (a connect to a master that died,
        // tried again after the topology named its successor).
        self.reroute_retries(member, now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) has work to do: a command whose node
    /// timeout passes, a connect that may be overdue, a node whose compare-and-deletes wait for
    /// its backoff to pass, the end of closing. The shell reads every connection before it
    /// acts on a passed node timeout, so that a reply that came but was not read yet is never
    /// taken for a timeout.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let connect = self.config.connect_timeout;
        let mut next = self.closing.map(|c| c.until.min(c.progress + CLOSE_STALL));
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for topo in self.topo.iter().flatten() {
            consider(topo.due());
        }
        consider(self.sentinels_due());
        // A Sentinel member without a master named cannot connect: what it keeps waits for
        // the sentinels' answer (their round is due above), not for its backoff.
        for i in 0..self.nodes.len() {
            let masterless = !self.nodes[i].retries.is_empty() && self.without_master(i).is_some();
            let n = &mut self.nodes[i];
            consider(n.unconfirmed.due(&n.cmd));
            consider(n.cmd.next_due());
            consider(n.cmd.connecting_since().map(|s| s + connect));
            consider(n.sub.connecting_since().map(|s| s + connect));
            if !n.retries.is_empty() {
                if !masterless {
                    consider(n.cmd.retry_at());
                }
                if !n.cmd.is_down() {
                    consider(n.again_at);
                }
                // An owner waiting for a release kept to send again hears by its node timeout.
                for r in &n.retries {
                    if let Slot::Reply {
                        due, fired: false, ..
                    } = r.slot
                    {
                        consider(Some(due));
                    }
                }
            }
        }
        next
    }

    /// Tells the owner of every command whose node timeout passed by `now` that the node timed
    /// out for it (the one place that decides it), fails the connects that took longer than
    /// the connect timeout, and reconnects the nodes whose compare-and-deletes wait, once their
    /// backoff has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let connect = self.config.connect_timeout;
        for i in 0..self.nodes.len() {
            let mail = &mut self.mail;
            let member = self.nodes[i].member;
            self.nodes[i].cmd.fire_due(now, |slot| {
                if let Slot::Reply {
                    caller, run, tag, ..
                } = *slot
                {
                    mail.post(
                        caller as usize,
                        run,
                        Event::Failure {
                            node: member,
                            tag,
                            why: NodeErrorKind::Timeout,
                        },
                    );
                }
            });
            for sub in [false, true] {
                let id = ConnId { node: i, sub };
                let overdue = self
                    .conn(id)
                    .connecting_since()
                    .is_some_and(|s| now.saturating_duration_since(s) >= connect);
                if overdue {
                    self.io.push_back(Io::Close(id));
                    // A TLS handshake unanswered at the connect timeout, on a stream that is
                    // connected: a plaintext Redis reads a TLS hello as the start of a command
                    // line, and waits for its end without a word. A configuration error.
                    let why = if self.conn(id).is_handshaking() && self.node_addr(i).tls {
                        NodeErrorKind::Setup {
                            command: "TLS",
                            cause: Box::new(NodeErrorKind::Tls(TlsFailure::NotTls)),
                        }
                    } else {
                        NodeErrorKind::Connect(std::io::ErrorKind::TimedOut)
                    };
                    self.handle_connect_failed(id, why, now);
                }
            }
            self.confirm_if_idle(i, now);
            let node = &mut self.nodes[i];
            if !node.retries.is_empty() {
                // A release kept to send again while its node is unreachable: its owner, if it
                // still waits, counts the node as timed out once the node timeout of what it
                // sent passes (or the release is given up); the release is still sent again,
                // and a reply that comes later still reaches the owner, as any late reply does.
                let expired = node.retries.iter().all(|r| r.redo.until <= now);
                for r in &mut node.retries {
                    if let Slot::Reply {
                        caller,
                        run,
                        tag,
                        due,
                        ref mut fired,
                        ..
                    } = r.slot
                    {
                        if !*fired && (due <= now || expired) {
                            *fired = true;
                            self.mail.post(
                                caller as usize,
                                run,
                                Event::Failure {
                                    node: member,
                                    tag,
                                    why: NodeErrorKind::Timeout,
                                },
                            );
                        }
                    }
                }
                if expired {
                    node.retries.clear();
                    node.retry_bytes.clear();
                    node.again_at = None;
                } else if !node.cmd.is_down() && node.again_at.is_some_and(|t| t <= now) {
                    // Refused a moment ago, on a connection that is still up: sent again.
                    self.requeue(i, NodeErrorKind::Timeout, now);
                    self.touch(ConnId {
                        node: i,
                        sub: false,
                    });
                } else {
                    self.connect_if_down(i, now);
                }
            }
        }
        for member in 0..self.members {
            self.refresh_if_due(member, now);
        }
    }

    /// The client closes from `now` on: [`close_outcome`](Self::close_outcome) says when
    /// that is over. Until then the shell keeps writing, reading and running the timers:
    /// nodes answer what they owe, and the compare-and-deletes of broken connections are sent
    /// again. It is over once nothing is owed, after [`CLOSE_LIMIT`], or once no node has
    /// answered anything for [`CLOSE_STALL`] (those that owe are down, or paused; a cluster's
    /// answers to topology reads are no progress on what is owed). A close that follows another
    /// with no operation in between (a drop after `close()`) ends by the first one's limit:
    /// the two together wait [`CLOSE_LIMIT`] at most.
    pub fn begin_close(&mut self, now: Instant) {
        let until = *self.closed_until.get_or_insert(now + CLOSE_LIMIT);
        self.closing = Some(Closing {
            until,
            progress: now,
        });
        self.handle_timeout(now);
    }

    /// Once closing is over: the nodes left with compare-and-deletes (releases, cleanups) not
    /// known to have reached them, which keep what they were to delete until its TTL. `None`
    /// while it goes on, or when the client is not closing.
    pub fn close_outcome(&mut self, now: Instant) -> Option<Vec<usize>> {
        let c = self.closing?;
        let over = !self.busy(now)
            || now >= c.until
            || now.saturating_duration_since(c.progress) >= CLOSE_STALL;
        if !over {
            return None;
        }
        self.closing = None;
        Some(self.undelivered(now))
    }

    /// Whether compare-and-deletes need someone to drive the endpoint until they are
    /// answered, even when no caller has an operation under way: those of a broken connection
    /// or refused for a while, to send again, and every one not answered yet (its connection
    /// may be closed already, its node may answer `NOSCRIPT` or `BUSY`, or, on a cluster
    /// member, `MOVED` or `ASK`, and only reading it tells). Those to send again are worth it
    /// only until what they delete expires; one not answered yet on a live connection is
    /// tended until its reply comes, whenever that is: a node slow for its load may run a
    /// lock's write queued before it only then, and that write lives a TTL from there (a
    /// `NOSCRIPT` then sends the release again with its body, see `owe_again`). A connection
    /// whose peer is gone breaks within the dead-peer timeout, which bounds the wait.
    ///
    /// So do the sentinels of a member that has no master yet, or whose round is under way: a
    /// call fails at once on such a member, without waiting for anything, and the round would
    /// otherwise move on only while some other call waits.
    ///
    /// So does a cluster member whose command was refused because its map gave the slot no
    /// master: its topology is read again until a master serves the slot (for a while at most,
    /// see `Topology::chase`), so that a lock asked for once the failover settled is routed
    /// to the new master rather than refused on a map read during the failover.
    pub fn needs_tending(&self, now: Instant) -> bool {
        self.nodes
            .iter()
            .any(|n| n.owes_until(now) || (n.cmd.redo_until().is_some() && !n.cmd.is_down()))
            || self.sentinels_pending()
            || self.chasing(now)
    }

    /// Whether a cluster member reads its topology again on its own for a slot a command was
    /// refused for, the map giving it no master (see `Topology::chase`).
    fn chasing(&self, now: Instant) -> bool {
        self.topo.iter().flatten().any(|t| t.chasing(now))
    }

    /// Whether some of what [`needs_tending`](Self::needs_tending) asks for cannot wait for the
    /// next call: everything but compare-and-deletes written on a ready connection (nothing
    /// left to write on it) whose replies are still to come. Those are read by whichever call
    /// comes next, or by a thread of the client a short while later; a compare-and-delete to
    /// send again (its connection broke, or its node refused it for now), one whose replicas'
    /// `WAIT` is still owed, a connection being set up or with bytes still to write, a
    /// Sentinel round and a cluster slot chased for want of a master need someone at once.
    pub fn tending_urgent(&self, now: Instant) -> bool {
        self.sentinels_pending()
            || self.chasing(now)
            || self.nodes.iter().any(|n| {
                let waits = n.cmd.is_ready() && !n.cmd.has_pending_output();
                n.retries.iter().any(|r| r.redo.until > now)
                    || n.awaiting.as_ref().and_then(Awaiting::redo_until) > Some(now)
                    || n.unconfirmed.owes_until(now)
                    || (!waits
                        && n.cmd
                            .redo_until()
                            .is_some_and(|u| u > now || !n.cmd.is_down()))
            })
    }

    /// Whether a command connection still owes replies, or a node still has compare-and-deletes
    /// to send again that are worth it: what a client waits for before it closes.
    pub fn busy(&self, now: Instant) -> bool {
        self.nodes.iter().any(|n| {
            (!n.cmd.is_down() && (n.cmd.owes_replies() || n.cmd.has_pending_output()))
                || n.retries.iter().any(|r| r.redo.until > now)
                || n.awaiting.as_ref().and_then(Awaiting::redo_until) > Some(now)
                || n.unconfirmed.owes_until(now)
        })
    }

    /// The nodes with compare-and-deletes (releases, cleanups) not known to have reached them,
    /// worth sending still at `now`: those a client that closes now would leave behind.
    pub fn undelivered(&self, now: Instant) -> Vec<usize> {
        let mut members: Vec<usize> = self
            .nodes
            .iter()
            .filter(|n| n.owes_until(now))
            .map(|n| n.member)
            .collect();
        members.sort_unstable();
        members.dedup();
        members
    }

    /// Every command connection is down, or set up and owes nothing: a warm-up is over.
    pub fn is_settled(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.cmd.is_down() || (n.cmd.is_ready() && n.cmd.owed() == 0))
    }

    /// The nodes whose last connection was closed because its setup was refused (see
    /// [`NodeErrorKind::Setup`]), with the reason.
    pub fn setup_failures(&self) -> Vec<(usize, NodeErrorKind)> {
        // Kept in member order by inserting each after those before it and its equals (a
        // stable sort, with no copy of the standard library's sort for this cold path).
        let mut failures: Vec<(usize, NodeErrorKind)> = Vec::new();
        let insert = |failures: &mut Vec<(usize, NodeErrorKind)>, member, e: &NodeErrorKind| {
            let at = failures.partition_point(|(m, _)| *m <= member);
            failures.insert(at, (member, e.clone()));
        };
        for w in self.sentinels.iter().flatten() {
            // Every sentinel refused the credentials, or did not know the service.
            if let Some(e) = &w.config_error {
                insert(&mut failures, self.nodes[w.link].member, e);
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if self.is_sentinel_link(i) {
                continue;
            }
            if let Some(e) = n.cmd.setup_error() {
                if !failures.iter().any(|(m, _)| *m == n.member) {
                    insert(&mut failures, n.member, e);
                }
            }
        }
        failures
    }

    // --- wake channels -------------------------------------------------------------------

    /// Subscribes the caller to the channels `m` writes for `t` (see [`Channels`]).
    fn subscribe<M: Machine>(
        &mut self,
        t: &Transmit,
        m: &mut M,
        caller: CallerId,
        run: u64,
        now: Instant,
    ) {
        self.channels
            .add(t, m, caller, run, &self.config.limits, &mut self.mail);
        for k in 0..self.channels.changed.len() {
            let idx = self.channels.changed[k];
            for i in 0..self.members {
                if self.topo[i].is_some() {
                    self.subscribe_sharded(i, idx, now);
                } else {
                    self.subscribe_on(i, idx, now);
                }
            }
        }
        self.channels
            .await_confirmations(caller, run, &mut self.mail);
    }

    /// Subscribes cluster member `member` to channel `idx`: on the link of the master that
    /// owns the channel's slot, as the slot map says (the seed link while no map was read,
    /// or while the slot has no master: the cluster answers where it is).
    fn subscribe_sharded(&mut self, member: usize, idx: usize, now: Instant) {
        self.refresh_if_due(member, now);
        let slot = self.channels.slot(idx);
        let link = self.topo[member]
            .as_ref()
            .and_then(|t| t.link(slot))
            .unwrap_or(member);
        self.channels.set_on(idx, member, Some(link));
        if !self.subscribe_on(link, idx, now) {
            // Its connection waits out its backoff: tried again after the next topology read.
            self.channels.set_on(idx, member, None);
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
    }

    /// Subscribes node `i`'s pub/sub connection to channel `idx`, connecting it first if it is
    /// down and due (then every live channel of that connection is subscribed to); `false`
    /// when it cannot be now (a connection in its backoff).
    fn subscribe_on(&mut self, i: usize, idx: usize, now: Instant) -> bool {
        if self.is_free(i) || self.without_master(i).is_some() {
            return false;
        }
        let member = self.nodes[i].member;
        let sharded = self.topo[member].is_some().then_some(member);
        let node = &mut self.nodes[i];
        if !node.sub.can_send(now) {
            return false;
        }
        let fresh = node.sub.is_down();
        if fresh {
            let addr = match &node.addr {
                Some(a) => a,
                None => &self.config.nodes[i],
            };
            node.sub.start(addr, sharded.is_some(), now);
            self.io
                .push_back(Io::Connect(ConnId { node: i, sub: true }));
        }
        let sub = &mut self.nodes[i].sub;
        self.channels
            .write_subscribe(i, Some(idx), fresh, sharded, |write| {
                sub.queue_unmatched(|out| write(out))
            });
        self.touch(ConnId { node: i, sub: true });
        true
    }

    /// After a topology read of cluster member `member`: every channel callers hold is
    /// subscribed to at the master its slot's map names, and unsubscribed from where it was.
    fn resubscribe(&mut self, member: usize, now: Instant) {
        for idx in 0..self.channels.len() {
            if !self.channels.held(idx) {
                continue;
            }
            let slot = self.channels.slot(idx);
            let want = self.topo[member].as_ref().and_then(|t| t.link(slot));
            let was = self.channels.on(idx, member);
            if was == want && want.is_some() {
                continue;
            }
            if let Some(old) = was {
                self.channels.set_on(idx, member, None);
                self.unsubscribe_on(old, idx, true);
            }
            if want.is_some() {
                self.subscribe_sharded(member, idx, now);
            }
        }
    }

    /// What a message on node `i`'s pub/sub connection asked for, on a cluster member: a
    /// channel whose slot left the master is subscribed to where the map says its slot is
    /// (a stale map is corrected by the `-MOVED` that answers, and a topology read is asked
    /// for); a `-MOVED` answer moves the slot in the map and sends the subscriptions it
    /// answered to the master named. Any other error leaves the channels it answered to the
    /// next topology read: their waiters are not kept waiting for a confirmation.
    fn handle_sharded_push(&mut self, i: usize, push: Push, now: Instant) {
        let member = self.nodes[i].member;
        if self.topo[member].is_none() {
            return;
        }
        match push {
            Push::Nothing => {}
            Push::Dropped(idx) => {
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.want = true;
                }
                self.subscribe_sharded(member, idx, now);
            }
            Push::Error(bytes) => {
                let from = match self.node_addr(i).target(self.nodes[i].sub.trying) {
                    Target::Tcp(a) => Some(a),
                    Target::Unix(_) => None,
                };
                let redirect = cluster::redirect(&bytes, from);
                let slot = match redirect {
                    Some(r) => r.slot,
                    // An error without a slot answers the oldest subscription still owed.
                    None => match (0..self.channels.len()).find(|&k| {
                        self.channels.on(k, member) == Some(i)
                            && !self
                                .channels
                                .owed_at(i, member, self.channels.slot(k))
                                .is_empty()
                    }) {
                        Some(k) => self.channels.slot(k),
                        None => return,
                    },
                };
                let answered = self.channels.owed_at(i, member, slot);
                let target = redirect
                    .filter(|r| !r.ask)
                    .and_then(|r| r.to)
                    .and_then(|a| self.link_for(member, a, now))
                    .filter(|&t| t != i);
                if let Some(topo) = self.topo[member].as_mut() {
                    if let Some(t) = target {
                        topo.set(slot, t);
                    }
                    topo.want = true;
                }
                // One error answers one subscription.
                let Some(&idx) = answered.first() else {
                    return;
                };
                match target {
                    Some(t) => {
                        self.channels.set_on(idx, member, Some(t));
                        if self.subscribe_on(t, idx, now) {
                            self.channels.move_awaiting(idx, i, t);
                        } else {
                            self.channels.set_on(idx, member, None);
                            self.channels.not_owed(i, idx, &mut self.mail);
                        }
                    }
                    None => {
                        self.channels.set_on(idx, member, None);
                        self.channels.not_owed(i, idx, &mut self.mail);
                    }
                }
            }
        }
    }

    /// Unsubscribes node `i`'s pub/sub connection from channel `idx`, if it is up.
    fn unsubscribe_on(&mut self, i: usize, idx: usize, sharded: bool) {
        let sub = &mut self.nodes[i].sub;
        if sub.is_up() {
            self.channels.write_unsubscribe(i, idx, sharded, |write| {
                sub.queue_unmatched(|out| write(out))
            });
            self.dirty.insert(ConnId { node: i, sub: true }.index());
        }
    }

    /// Drops the caller's references to its channels; those nobody holds any more are
    /// unsubscribed from.
    fn unsubscribe(&mut self, caller: CallerId, run: u64, _now: Instant) {
        self.channels.remove(caller, run, &mut self.mail);
        for k in 0..self.channels.changed.len() {
            let idx = self.channels.changed[k];
            for i in 0..self.members {
                if self.topo[i].is_none() {
                    self.unsubscribe_on(i, idx, false);
                } else if let Some(link) = self.channels.on(idx, i) {
                    self.channels.set_on(idx, i, None);
                    self.unsubscribe_on(link, idx, true);
                }
            }
        }
    }
}

/// The reply to a `WAIT` or a `WAITAOF` read on a node of member `member`.
struct Waited<'a> {
    bytes: &'a [u8],
    /// [`Slot::Wait`] or [`Slot::WaitAof`].
    slot: Slot,
    /// Another wait answers next (a `WAITAOF` after this `WAIT`).
    more: bool,
    wants: (u32, Option<(u32, u32)>),
    member: usize,
    now: Instant,
}

/// What a wait's reply `w` does to the reply held behind it (`awaiting`): it waits for the
/// next wait, or counts (its owner gets it), or falls short (its owner gets the failure, never
/// a vote; a compare-and-delete stays owed, into `unacked`). The cleanups its connection ran
/// before it without a wait of their own (`unconfirmed`) are confirmed if it said enough, and
/// kept if not. Returns how many replies read were no progress: the wait's own if nothing
/// waited for it (its command was refused, or redirected, or it is the endpoint's own for
/// the cleanups), or every one read for a compare-and-delete that stays owed.
#[allow(clippy::too_many_arguments)]
fn answer_wait(
    awaiting: &mut Option<Awaiting>,
    w: Waited<'_>,
    limits: &crate::resp::Limits,
    stats: &Recorder,
    mail: &mut Mail,
    unacked: &mut Vec<Refusal>,
    again_backoff: &mut Duration,
    unconfirmed: &mut Unconfirmed,
) -> u64 {
    let verdict = waited(w.bytes, w.wants, w.slot, limits);
    // It answers for every earlier write of its connection: the cleanups kept too.
    let first = w.slot == Slot::Wait || w.wants.0 == 0;
    unconfirmed.waited(first, verdict.is_ok(), w.more, w.now);
    let Some(mut a) = awaiting.take() else {
        return 1;
    };
    if verdict.is_ok() && w.more {
        a.reads += 1;
        *awaiting = Some(a);
        return 0;
    }
    if let Slot::Reply {
        caller,
        run,
        tag,
        sent,
        ..
    } = a.slot
    {
        stats.reply(w.member, w.now.saturating_duration_since(sent));
        match &verdict {
            Ok(()) => mail.post_reply(caller as usize, run, w.member, tag, &a.reply),
            Err(why) => mail.post(
                caller as usize,
                run,
                Event::Failure {
                    node: w.member,
                    tag,
                    why: why.clone(),
                },
            ),
        }
    }
    match (verdict, a.slot.redo()) {
        (Ok(()), Some(_)) => {
            *again_backoff = BACKOFF_MIN;
            0
        }
        (Err(_), Some(redo)) => {
            // Nobody waits for it any more: its owner heard the failure.
            unacked.push(Refusal {
                slot: Slot::Discard {
                    redo: Some(redo),
                    given: None,
                },
                kind: Refused::Unacknowledged,
                command: a.command,
                before: redo.before as usize,
                reply: Vec::new(),
            });
            a.reads + 1
        }
        _ => 0,
    }
}

/// Queues on `cmd` `WAIT n ms` when `n` > 0, then `WAITAOF L R ms` for `aof` (see
/// [`Endpoint::queue_wait`]).
fn queue_waits(cmd: &mut Conn, n: u32, aof: Option<(u32, u32)>, ms: u64) {
    if n > 0 {
        cmd.queue(Slot::Wait, None, |out| {
            crate::resp::write_array_len(out, 3);
            crate::resp::write_bulk(out, b"WAIT");
            crate::resp::write_bulk_u64(out, n.into());
            crate::resp::write_bulk_u64(out, ms);
            0
        });
    }
    if let Some((local, replicas)) = aof {
        cmd.queue(Slot::WaitAof, None, |out| {
            crate::resp::write_array_len(out, 4);
            crate::resp::write_bulk(out, b"WAITAOF");
            crate::resp::write_bulk_u64(out, local.into());
            crate::resp::write_bulk_u64(out, replicas.into());
            crate::resp::write_bulk_u64(out, ms);
            0
        });
    }
}

/// What the reply to a `WAIT` or a `WAITAOF` after a grant (`slot`, [`Slot::Wait`] or
/// [`Slot::WaitAof`]) says of the grant: it counts only if at least as many replicas as
/// `wants` asks (`?wait=N`, then `?waitaof=L,R`: the master's own fsync and the replicas')
/// acknowledged it; fewer, or an error (`NOREPLICAS`, a refusal, `WAITAOF` on a server
/// without an append-only file or too old for it), is a failure of the node for it, never a
/// vote.
fn waited(
    bytes: &[u8],
    wants: (u32, Option<(u32, u32)>),
    slot: Slot,
    limits: &crate::resp::Limits,
) -> Result<(), NodeErrorKind> {
    let answer = cluster::decode(bytes, limits);
    let failed = |message: String| {
        Err(NodeErrorKind::Server {
            kind: crate::resp::ServerErrorKind::Other,
            message,
        })
    };
    if slot == Slot::WaitAof {
        let (local, replicas) = wants.1.unwrap_or((0, 0));
        let counts = match &answer {
            Some(Reply::Array(Some(items))) => match items.as_slice() {
                [Reply::Integer(l), Reply::Integer(r)] => Some((*l, *r)),
                _ => None,
            },
            _ => None,
        };
        return match (counts, answer) {
            (Some((l, r)), _) if l >= i64::from(local) && r >= i64::from(replicas) => Ok(()),
            (Some((l, r)), _) => failed(format!(
                "NOREPLICAS WAITAOF {local} {replicas}: the write was fsynced locally {l} \
                 and by {r} replicas within the node timeout"
            )),
            (None, Some(Reply::Error(e))) => failed(format!(
                "WAITAOF {local} {replicas} refused: {}",
                String::from_utf8_lossy(e)
            )),
            (None, _) => failed(format!(
                "WAITAOF {local} {replicas}: an unexpected reply, not [local, replicas]"
            )),
        };
    }
    let replicas = wants.0;
    match answer {
        Some(Reply::Integer(n)) if n >= i64::from(replicas) => Ok(()),
        answer => {
            let reached = match answer {
                Some(Reply::Integer(n)) => n.to_string(),
                _ => "none".to_owned(),
            };
            failed(format!(
                "NOREPLICAS the write reached {reached} of the {replicas} replicas WAIT \
                 asked for within the node timeout"
            ))
        }
    }
}

/// Decodes one framed reply for a machine, its arrays in `arrays`' spare vectors, or says why
/// it cannot be.
pub(crate) fn decode_reply<'a>(
    bytes: &'a [u8],
    limits: &crate::resp::Limits,
    arrays: &mut crate::resp::Arrays,
) -> Result<Reply<'a>, NodeErrorKind> {
    match arrays.decode(bytes, limits) {
        Ok(crate::resp::Status::Complete((reply, _))) => Ok(reply),
        Ok(crate::resp::Status::Partial) => Err(NodeErrorKind::UnexpectedReply),
        Err(e) => Err(NodeErrorKind::Protocol(e)),
    }
}

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
