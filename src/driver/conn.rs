//! One node's connection: the non-blocking connect, setup (AUTH, SELECT, SCRIPT LOAD), bounded
//! buffers, and the queue of replies still owed to us, matched in order.
//!
//! Nothing but the setup is sent before every setup reply has been read and checked: commands
//! queued meanwhile wait in a separate buffer, so a refused `AUTH` or `SELECT` can never let a
//! lock command run as the wrong user or in the wrong database.
//!
//! Everything about the connect procedure lives here and nowhere else: a non-blocking
//! `connect` finishes only after a WRITABLE event, a clean `take_error()` and a `peer_addr()`
//! that answers; anything earlier is a spurious wake-up. A connect that is refused, fails or
//! times out moves on to the node's next address (a host name may resolve to several), with
//! the setup still queued, until one takes it or none is left.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::engine::machine::Tag;
use crate::engine::ops::{Caps, SCRIPTS};
use crate::error::NodeErrorKind;
use crate::resp::{self, Limits, Reply, ServerErrorKind, Status};
use crate::url::NodeAddr;

/// How many replies a connection may owe before it is presumed wedged and reset. Every thread
/// of a client shares the connection, so this allows for many callers' commands in flight.
const MAX_OWED: usize = 4096;
/// Read granularity; also the first size of the input buffer.
const READ_CHUNK: usize = 16 * 1024;
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One command of a connection's setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    /// `AUTH [user] password`, as the URL asks; must succeed.
    Auth,
    /// `SELECT db`, as the URL asks; must succeed.
    Select,
    /// `SCRIPT LOAD`: a refusal (ACLs) is tolerated, EVALSHA then falls back to EVAL.
    ScriptLoad,
    /// `COMMAND INFO DELEX HSETEX`, whose answer sets [`Conn::caps`]; a refusal is tolerated.
    Caps,
}

impl Setup {
    fn command(self) -> &'static str {
        match self {
            Setup::Auth => "AUTH",
            Setup::Select => "SELECT",
            Setup::ScriptLoad => "SCRIPT LOAD",
            Setup::Caps => "COMMAND INFO",
        }
    }

    /// The connection is of no use unless this command succeeds.
    fn required(self) -> bool {
        matches!(self, Setup::Auth | Setup::Select)
    }

    /// What an error reply to this command means: `None` when it is tolerated, a
    /// [`NodeErrorKind::Setup`] when the node's URL or configuration is wrong, a plain server
    /// error (failing the connection, to be retried later) when it is transient.
    fn refused(self, message: &[u8]) -> Option<NodeErrorKind> {
        let kind = ServerErrorKind::of(message);
        let transient = matches!(
            kind,
            ServerErrorKind::Loading
                | ServerErrorKind::Busy
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::Oom
        ) || message.starts_with(b"ERR max number of clients");
        // Wrong or missing credentials show on whichever command comes first; so does protected
        // mode, which refuses every command from this address.
        let config = !transient
            && (self.required()
                || matches!(kind, ServerErrorKind::NoAuth | ServerErrorKind::WrongPass)
                || message.starts_with(b"DENIED"));
        let error = crate::engine::ops::server_error(message);
        if config {
            Some(self.failed(error))
        } else {
            self.required().then_some(error)
        }
    }

    /// Checks this command's reply: an error the connection cannot live with, or a reply no
    /// Redis server gives to `AUTH` or `SELECT`, fails it.
    fn check(self, reply: &Reply<'_>) -> Result<(), NodeErrorKind> {
        match reply {
            Reply::Error(m) => self.refused(m).map_or(Ok(()), Err),
            // AUTH and SELECT answer +OK and nothing else.
            Reply::Simple(b"OK") => Ok(()),
            _ if self.required() => Err(self.failed(NodeErrorKind::UnexpectedReply)),
            _ => Ok(()),
        }
    }

    /// The configuration error for this command failing with `cause`.
    fn failed(self, cause: NodeErrorKind) -> NodeErrorKind {
        NodeErrorKind::Setup {
            command: self.command(),
            cause: Box::new(cause),
        }
    }
}

/// What a reply in the queue is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A command of the connection's setup.
    Setup(Setup),
    /// A reply to the transmit tagged `tag` of the machine the driver runs as run `run` for
    /// the caller in slot `caller`, whose command was queued at `sent`.
    Reply {
        run: u64,
        caller: u32,
        tag: Tag,
        sent: Instant,
    },
    /// A reply to a command written before the one whose reply is the vote, in the same
    /// sequence (`MULTI` and the commands queued inside a transaction). Dropped, but an error
    /// among them is what the vote reports if the transaction is aborted for it.
    Before,
    /// A reply nobody waits for (cleanup after a lost round).
    Discard,
    /// A message on a subscriber connection (confirmations and published messages alike).
    Push,
}

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Lock commands, each reply owed to a queued slot.
    Commands,
    /// Pub/sub: after setup, every reply is a push message.
    Subscriber,
}

#[derive(Debug)]
enum State {
    /// No socket. A new connect may start at `retry_at`.
    Down {
        retry_at: Instant,
    },
    /// Connect in progress since `since`.
    Connecting {
        since: Instant,
    },
    Up,
}

#[derive(Debug)]
pub(crate) struct Conn {
    /// The poll token, unique within the driver.
    token: Token,
    role: Role,
    stream: Option<TcpStream>,
    state: State,
    /// Bytes to send; `out[out_pos..]` is still pending.
    out: Vec<u8>,
    out_pos: usize,
    /// Received bytes; `inp[inp_pos..inp_end]` is not yet decoded.
    inp: Vec<u8>,
    inp_pos: usize,
    inp_end: usize,
    owed: VecDeque<Slot>,
    /// How many of the slots at the back of `owed` were queued but are not known to be
    /// written yet (see [`take_written`](Conn::take_written)).
    unwritten: usize,
    /// How many setup replies are still owed; they come first in `owed`. While any is,
    /// queued commands wait in `held`.
    setup_owed: usize,
    /// Commands queued before the setup was answered, sent once it was, all of it OK.
    held: Vec<u8>,
    backoff: Duration,
    registered: Option<Interest>,
    last_error: Option<NodeErrorKind>,
    /// The poller reported a hang-up or error: read until the socket says so.
    hangup: bool,
    /// The first error reply among the [`Slot::Before`] replies of the sequence being read,
    /// as received: a transaction that a node aborted (`EXECABORT`) for a refused command
    /// reports that refusal (`READONLY`, `MISCONF`, `OOM`, ...).
    before_error: Vec<u8>,
    /// What the node's server offers, as the last setup answered on any of this node's
    /// connections said; all `false` until a setup says otherwise. A reconnect keeps it, so a
    /// command's form never depends on whether a new connection's setup was answered yet.
    pub caps: Caps,
    /// The node's addresses, copied at each connect, and the one being tried: a connect
    /// that fails moves on to the next, with the setup and whatever is held behind it.
    addrs: Vec<SocketAddr>,
    trying: usize,
}

impl Conn {
    pub fn new(token: usize, role: Role) -> Conn {
        Conn {
            token: Token(token),
            role,
            stream: None,
            state: State::Down {
                retry_at: Instant::now(),
            },
            out: Vec::with_capacity(512),
            out_pos: 0,
            inp: Vec::new(),
            inp_pos: 0,
            inp_end: 0,
            owed: VecDeque::with_capacity(64),
            unwritten: 0,
            setup_owed: 0,
            held: Vec::new(),
            backoff: BACKOFF_MIN,
            registered: None,
            last_error: None,
            hangup: false,
            before_error: Vec::new(),
            caps: Caps::default(),
            addrs: Vec::new(),
            trying: 0,
        }
    }

    /// True when commands can be queued: connected, connecting, or due for a new connect.
    pub fn can_send(&self, now: Instant) -> bool {
        match self.state {
            State::Down { retry_at } => now >= retry_at,
            _ => true,
        }
    }

    /// Why the node is down, for the vote of a node that cannot be sent to.
    pub fn down_reason(&self) -> NodeErrorKind {
        self.last_error.clone().unwrap_or(NodeErrorKind::Backoff)
    }

    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up)
    }

    /// Connected, and every setup reply read and found good: commands go out as queued.
    pub fn is_ready(&self) -> bool {
        self.is_up() && self.setup_owed == 0
    }

    /// No socket: the last connect failed or the connection was dropped.
    pub fn is_down(&self) -> bool {
        matches!(self.state, State::Down { .. })
    }

    /// The configuration error that closed this connection last, if that is why it is down.
    pub fn setup_error(&self) -> Option<&NodeErrorKind> {
        match (&self.state, &self.last_error) {
            (State::Down { .. }, Some(e @ NodeErrorKind::Setup { .. })) => Some(e),
            _ => None,
        }
    }

    /// Bytes queued but not yet written.
    pub fn has_pending_output(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// The replies still owed, oldest first.
    pub fn owed(&self) -> usize {
        self.owed.len()
    }

    /// When the oldest reply still owed to a caller was queued, if any is owed.
    pub fn oldest_reply_since(&self) -> Option<Instant> {
        self.owed.iter().find_map(|s| match s {
            Slot::Reply { sent, .. } => Some(*sent),
            _ => None,
        })
    }

    /// Makes sure a socket exists, starting a connect (with its setup queued) if the node is
    /// down and its backoff has passed. Checks that a pending connect is not overdue and that the
    /// connection is not wedged.
    pub fn prepare(
        &mut self,
        registry: &Registry,
        addr: &NodeAddr,
        now: Instant,
        connect_timeout: Duration,
    ) -> Result<(), NodeErrorKind> {
        match self.state {
            State::Connecting { since }
                if now.saturating_duration_since(since) >= connect_timeout =>
            {
                self.next_address(
                    registry,
                    NodeErrorKind::Connect(io::ErrorKind::TimedOut),
                    now,
                )
            }
            State::Down { retry_at } if now >= retry_at => self.connect(registry, addr, now),
            State::Down { .. } => Err(self.down_reason()),
            _ if self.owed.len() >= MAX_OWED => Err(NodeErrorKind::Timeout),
            _ => Ok(()),
        }
    }

    fn connect(
        &mut self,
        registry: &Registry,
        node: &NodeAddr,
        now: Instant,
    ) -> Result<(), NodeErrorKind> {
        self.addrs.clone_from(&node.addrs);
        self.open_from(registry, 0, now)?;
        // What the node's server offers stays as the last setup learnt it: commands queued
        // behind this setup are written for that server (see `take_replies`).
        self.queue_setup(node);
        self.update_interest(registry)
            .map_err(|e| NodeErrorKind::Connect(e.kind()))
    }

    /// Starts a connect to the first of the node's addresses from `first` on that takes one
    /// (dropping the socket of a connect that failed); the last one's error if none does.
    fn open_from(
        &mut self,
        registry: &Registry,
        first: usize,
        now: Instant,
    ) -> Result<(), NodeErrorKind> {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        self.registered = None;
        self.hangup = false;
        let mut error = io::ErrorKind::NotFound;
        for (i, &addr) in self.addrs.iter().enumerate().skip(first) {
            match open(addr) {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.trying = i;
                    self.state = State::Connecting { since: now };
                    return Ok(());
                }
                Err(e) => error = e.kind(),
            }
        }
        Err(NodeErrorKind::Connect(error))
    }

    /// The connect to the address being tried failed with `why`: starts one to the next
    /// address (the setup, and what is held behind it, stay queued: none of it was sent), or
    /// returns the last address's error when none is left.
    fn next_address(
        &mut self,
        registry: &Registry,
        why: NodeErrorKind,
        now: Instant,
    ) -> Result<(), NodeErrorKind> {
        if self.trying + 1 >= self.addrs.len() {
            return Err(why);
        }
        self.open_from(registry, self.trying + 1, now)?;
        self.update_interest(registry)
            .map_err(|e| NodeErrorKind::Connect(e.kind()))
    }

    /// AUTH and SELECT as the URL asks, and every script loaded so EVALSHA hits. This is all
    /// that is sent until every reply to it has been read.
    fn queue_setup(&mut self, node: &NodeAddr) {
        debug_assert!(self.owed.is_empty() && self.out.is_empty() && self.held.is_empty());
        if let Some(password) = &node.password {
            match &node.user {
                Some(user) => resp::encode_command(&mut self.out, &[b"AUTH", user, password]),
                None => resp::encode_command(&mut self.out, &[b"AUTH", password]),
            }
            self.owed.push_back(Slot::Setup(Setup::Auth));
        }
        if self.role == Role::Commands {
            // Channels are global to the server: a subscriber needs no database, no scripts.
            if node.db != 0 {
                resp::write_array_len(&mut self.out, 2);
                resp::write_bulk(&mut self.out, b"SELECT");
                resp::write_bulk_u64(&mut self.out, node.db.into());
                self.owed.push_back(Slot::Setup(Setup::Select));
            }
            for script in SCRIPTS {
                resp::encode_command(&mut self.out, &[b"SCRIPT", b"LOAD", script.body.as_bytes()]);
                self.owed.push_back(Slot::Setup(Setup::ScriptLoad));
            }
            // Redis 8.4 has DELEX and 8.0 HSETEX; older servers answer with a nil entry for
            // each command they lack, and ACLs with an error.
            resp::encode_command(&mut self.out, &[b"COMMAND", b"INFO", b"DELEX", b"HSETEX"]);
            self.owed.push_back(Slot::Setup(Setup::Caps));
        }
        self.setup_owed = self.owed.len();
    }

    /// Where queued commands go: straight out once the setup is answered, held until then.
    fn queue_buf(&mut self) -> &mut Vec<u8> {
        if self.setup_owed == 0 {
            &mut self.out
        } else {
            &mut self.held
        }
    }

    /// Queues bytes whose replies nobody matches: commands on a subscriber connection, where
    /// every reply is a push.
    pub fn queue_unmatched(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        encode(self.queue_buf());
    }

    /// Queues commands written by `encode`: the last one's reply is for `slot`; `encode`
    /// returns how many it wrote before that one, whose replies are owed too, and dropped.
    pub fn queue(&mut self, slot: Slot, encode: impl FnOnce(&mut Vec<u8>) -> usize) {
        let before = encode(self.queue_buf());
        for _ in 0..before {
            self.owed.push_back(Slot::Before);
        }
        self.owed.push_back(slot);
        self.unwritten += 1 + before;
    }

    /// Once everything queued has been written to the socket, hands every slot queued since
    /// the last call to `f`, oldest first: their commands have left.
    pub fn take_written(&mut self, mut f: impl FnMut(&Slot)) {
        if self.unwritten == 0 || self.has_pending_output() || !self.held.is_empty() {
            return;
        }
        let n = self.unwritten.min(self.owed.len());
        self.unwritten = 0;
        for slot in self.owed.iter().skip(self.owed.len() - n) {
            f(slot);
        }
    }

    /// Writes what is pending and, if `read`, reads what has arrived. Call after readiness and
    /// after queueing; readiness may be spurious, so this never assumes any I/O will succeed.
    pub fn drive(
        &mut self,
        registry: &Registry,
        limits: &Limits,
        read: bool,
    ) -> Result<(), NodeErrorKind> {
        if let State::Connecting { .. } = self.state {
            let Some(stream) = &self.stream else {
                return Err(NodeErrorKind::Connect(io::ErrorKind::NotConnected));
            };
            let failed = match stream.take_error() {
                Ok(None) => match stream.peer_addr() {
                    Ok(_) => None,
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
                    Err(e) => Some(e),
                },
                Ok(Some(e)) | Err(e) => Some(e),
            };
            if let Some(e) = failed {
                let why = NodeErrorKind::Connect(e.kind());
                return self.next_address(registry, why, Instant::now());
            }
            self.state = State::Up;
            self.backoff = BACKOFF_MIN;
            self.last_error = None;
        }
        self.write_out()?;
        if read {
            self.read_in(limits)?;
        }
        self.update_interest(registry)
            .map_err(|e| NodeErrorKind::Io(e.kind()))
    }

    fn write_out(&mut self) -> Result<(), NodeErrorKind> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        while self.out_pos < self.out.len() {
            match stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::WriteZero)),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    fn read_in(&mut self, limits: &Limits) -> Result<(), NodeErrorKind> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        // The most a single reply can need, so the buffer never grows past what the codec allows.
        let cap = limits
            .max_bulk
            .saturating_add(limits.max_line)
            .saturating_add(READ_CHUNK);
        loop {
            if self.inp_end == self.inp.len() {
                if self.inp_pos > 0 {
                    self.inp.copy_within(self.inp_pos..self.inp_end, 0);
                    self.inp_end -= self.inp_pos;
                    self.inp_pos = 0;
                }
                if self.inp_end == self.inp.len() {
                    if self.inp.len() >= cap {
                        // A reply bigger than the codec will ever accept: the decoder would
                        // already have refused it, so this is only reached by a broken server.
                        return Err(NodeErrorKind::UnexpectedReply);
                    }
                    let grow = self.inp.len().max(READ_CHUNK).min(cap - self.inp.len());
                    self.inp.resize(self.inp.len() + grow, 0);
                }
            }
            let space = self.inp.len() - self.inp_end;
            match stream.read(&mut self.inp[self.inp_end..]) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof)),
                // A short read emptied the socket's receive queue: anything arriving later is a
                // new edge for the poller, so the usual read that only returns WouldBlock would
                // be a wasted system call.
                Ok(n) if n < space && !self.hangup => {
                    self.inp_end += n;
                    return Ok(());
                }
                Ok(n) => self.inp_end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
    }

    /// Forgets every command held behind an unanswered setup, and the replies they would owe:
    /// none of it was sent, and none of it will be.
    #[allow(dead_code)]
    pub fn drop_held(&mut self) {
        self.held.clear();
        self.owed.truncate(self.setup_owed);
        self.unwritten = 0;
    }

    /// Decodes every complete reply and hands each, with the slot it answers and its bytes as
    /// received, to `handle`.
    /// The last setup reply releases the commands held behind it: the caller must
    /// [`drive`](Self::drive) again afterwards when [`has_pending_output`](Self::has_pending_output).
    ///
    /// A setup reply that shows the node's URL or configuration to be wrong, or any reply
    /// during the setup that is not RESP, fails with a [`NodeErrorKind::Setup`].
    pub fn take_replies(
        &mut self,
        limits: &Limits,
        mut handle: impl FnMut(Slot, &Reply<'_>, &[u8]),
    ) -> Result<(), NodeErrorKind> {
        loop {
            let input = &self.inp[self.inp_pos..self.inp_end];
            if input.is_empty() {
                break;
            }
            match resp::decode(input, limits) {
                Ok(Status::Complete((reply, used))) => {
                    let slot = match (self.owed.pop_front(), self.role) {
                        (Some(slot), _) => {
                            self.unwritten = self.unwritten.min(self.owed.len());
                            slot
                        }
                        (None, Role::Subscriber) => Slot::Push,
                        (None, Role::Commands) => return Err(NodeErrorKind::UnexpectedReply),
                    };
                    if let Slot::Setup(step) = slot {
                        step.check(&reply)?;
                        if step == Setup::Caps {
                            let caps = crate::engine::rw::caps_of(&reply);
                            let changed = caps != self.caps;
                            self.caps = caps;
                            // Commands held behind the setup were written for the server the
                            // node was; one that changed (an upgrade, a downgrade, or the
                            // first setup of a node never reached before) must not get them:
                            // they fail, and the next ones are written for it.
                            if changed && !self.held.is_empty() {
                                return Err(NodeErrorKind::ServerChanged);
                            }
                        }
                        self.setup_owed = self.setup_owed.saturating_sub(1);
                        if self.setup_owed == 0 && !self.held.is_empty() {
                            // Everything checked: what was held behind the setup may go.
                            if self.out_pos == self.out.len() {
                                std::mem::swap(&mut self.out, &mut self.held);
                                self.out_pos = 0;
                            } else {
                                self.out.extend_from_slice(&self.held);
                            }
                            self.held.clear();
                        }
                    }
                    match slot {
                        Slot::Before => {
                            if self.before_error.is_empty() && matches!(reply, Reply::Error(_)) {
                                self.before_error.extend_from_slice(&input[..used]);
                            }
                            handle(slot, &reply, &input[..used]);
                        }
                        Slot::Reply { .. }
                            if !self.before_error.is_empty()
                                && matches!(reply, Reply::Error(m) if m.starts_with(b"EXECABORT")) =>
                        {
                            // The transaction was discarded because a command in it was
                            // refused: the refusal is what the vote reports.
                            match resp::decode(&self.before_error, limits) {
                                Ok(Status::Complete((refusal, _))) => {
                                    handle(slot, &refusal, &self.before_error)
                                }
                                _ => handle(slot, &reply, &input[..used]),
                            }
                        }
                        _ => handle(slot, &reply, &input[..used]),
                    }
                    if !matches!(slot, Slot::Before) {
                        self.before_error.clear();
                    }
                    self.inp_pos += used;
                }
                Ok(Status::Partial) => break,
                // Not RESP in answer to the setup: whatever listens there is not Redis.
                Err(e) => {
                    return Err(match self.owed.front() {
                        Some(Slot::Setup(step)) if self.setup_owed > 0 => {
                            step.failed(NodeErrorKind::Protocol(e))
                        }
                        _ => NodeErrorKind::Protocol(e),
                    })
                }
            }
        }
        if self.inp_pos == self.inp_end {
            self.inp_pos = 0;
            self.inp_end = 0;
        }
        Ok(())
    }

    /// Notes that the poller saw the peer hang up (or an error): the next read goes on until
    /// the socket reports it.
    pub fn hung_up(&mut self) {
        self.hangup = true;
    }

    /// Drops the connection after `why`; returns the slots that were still owed so the caller
    /// can fail the votes among them. A new connect may start after the backoff.
    pub fn fail(
        &mut self,
        registry: &Registry,
        why: NodeErrorKind,
        now: Instant,
    ) -> VecDeque<Slot> {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        self.registered = None;
        self.hangup = false;
        self.before_error.clear();
        self.out.clear();
        self.out_pos = 0;
        self.held.clear();
        self.setup_owed = 0;
        self.inp_pos = 0;
        self.inp_end = 0;
        self.state = State::Down {
            retry_at: now + self.backoff,
        };
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.last_error = Some(why);
        self.unwritten = 0;
        std::mem::take(&mut self.owed)
    }

    /// Registers for WRITABLE only while a connect is in progress or output is pending.
    fn update_interest(&mut self, registry: &Registry) -> io::Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let want =
            if matches!(self.state, State::Connecting { .. }) || self.out_pos < self.out.len() {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
        match self.registered {
            Some(have) if have == want => Ok(()),
            Some(_) => {
                registry.reregister(stream, self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
            None => {
                registry.register(stream, self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
        }
    }
}

/// `connect` on a non-blocking socket reports this while the handshake is under way (std has no
/// stable `ErrorKind` for it yet).
#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

/// A non-blocking TCP socket to `addr`, connect started, with TCP_NODELAY (each command is one
/// small write that must not wait for Nagle) and keepalive (so a dead peer is noticed while idle).
fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(Duration::from_secs(30))
            .with_interval(Duration::from_secs(10)),
    )?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}
