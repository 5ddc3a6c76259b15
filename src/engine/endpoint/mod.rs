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
mod close;
pub(crate) mod cluster;
mod confirm;
mod conn;
mod mail;
mod node;
mod recv;
pub(crate) mod seats;
mod send;
mod sentinel;
pub(crate) mod setup;
mod subs;
mod timers;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::machine::{Machine, To, What};
use crate::engine::ops::Caps;
use crate::error::{NodeErrorKind, TlsFailure};
use crate::resp::Reply;
use crate::rng::{Entropy, Token};
use crate::stats::Recorder;
use crate::url::{NodeAddr, Target};

pub(crate) use bits::Bits;
pub(crate) use caller::{CallerLoop, Next};
use close::Closing;
#[cfg(test)]
use close::{CLOSE_LIMIT, CLOSE_STALL};
use cluster::{Kept, Topology};
use confirm::Unconfirmed;
use conn::{Conn, Redo, Refused, Slot, BACKOFF_MIN};
use mail::Mail;
#[cfg(test)]
use recv::waited;
use sentinel::Watch;
use setup::Server;
use subs::Channels;

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

    /// The address of node `link`'s connections: a member's URL, or a cluster master's.
    pub fn node_addr(&self, link: usize) -> &NodeAddr {
        match &self.nodes[link].addr {
            Some(a) => a,
            None => &self.config.nodes[link],
        }
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
        let i = id.node;
        if self.is_sentinel_link(i) {
            return match id.sub {
                false => self.sentinel_recv(i, now),
                true => self.sentinel_push(i, now),
            };
        }
        match id.sub {
            false => self.recv_replies(i, was, now),
            true => self.recv_pushes(i, now),
        }
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
