//! One connection to one node, without its socket: its state, the bytes to write and those
//! received, the replies it still owes (matched in order), its setup and what is held behind
//! it, and the compare-and-deletes it would send again on a new connection.
//!
//! Nothing but the setup is sent before every setup reply has been read and checked: commands
//! queued meanwhile wait in a separate buffer, so a refused `AUTH` or `SELECT` can never let a
//! lock command run as the wrong user or in the wrong database.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::setup::{self, Server, Setup};
use crate::engine::machine::Tag;
use crate::error::NodeErrorKind;
use crate::resp::{self, Limits, Reply, ServerErrorKind, Status};
use crate::rng::Token;
use crate::url::NodeAddr;

/// How many replies a connection may owe before it takes no more commands: every thread of a
/// client shares the connection, so this allows for many callers' commands in flight.
pub(crate) const MAX_OWED: usize = 4096;
/// Replies a commands connection makes room for when it first starts, and bytes of the
/// compare-and-deletes among them (kept to be sent again should the connection break): a
/// node that falls behind (its process not scheduled for a while on a loaded machine, a slow
/// command) owes the commands of every round the quorum ran without it, and each new
/// high-water mark of that backlog would otherwise cost an allocation in the steady state.
/// Room for about 250 acquire + release cycles of a mutex with a short key behind; a deeper
/// backlog grows the buffers (at least doubling them), which then keep their size.
const OWED_ROOM: usize = 512;
const REDO_ROOM: usize = 32 * 1024;
/// Read granularity; also the first size of the input buffer.
const READ_CHUNK: usize = 16 * 1024;
/// Reconnect backoff bounds.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(10);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A compare-and-delete that is sent again on the node's next connection if this one breaks
/// before its reply comes: its bytes are the next `len` of the connection's redo buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Redo {
    /// After this, whatever it deletes has expired anyway.
    pub until: Instant,
    /// Its bytes, in the redo buffer.
    pub len: u32,
    /// How many commands come before the one whose reply is the vote (`MULTI` ...).
    pub before: u32,
}

/// What a reply in the queue is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A command of the connection's setup.
    Setup(Setup),
    /// A reply to the transmit tagged `tag` of the operation the endpoint runs as run `run`
    /// for caller `caller`, whose command was queued at `sent`.
    Reply {
        caller: u32,
        run: u64,
        tag: Tag,
        sent: Instant,
        redo: Option<Redo>,
        /// When the node counts as timed out for this command if it has not answered: the node
        /// timeout after it was written (after it was queued, until it is written).
        due: Instant,
        /// The owner was told the node timed out; a late reply still reaches it.
        fired: bool,
    },
    /// A reply to a command written before the one whose reply is the vote, in the same
    /// sequence (`MULTI` and the commands queued inside a transaction). Dropped, but an error
    /// among them is what the vote reports if the transaction is aborted for it.
    Before,
    /// A reply nobody waits for (cleanup after a lost round, a queue leave). `given`: the
    /// give-back of a semaphore's slot granted beyond its quorum, by the holder with this
    /// token (see `What::GiveBack`), on the connection it was first sent on.
    Discard {
        redo: Option<Redo>,
        given: Option<Token>,
    },
    /// A message on a subscriber connection (confirmations and published messages alike).
    Push,
    /// The reply to a topology read (`CLUSTER SHARDS`) on a link of a cluster member.
    Topology,
    /// The reply to `SENTINEL get-master-addr-by-name`, on the link of a Sentinel member to
    /// one of its sentinels.
    Sentinel,
    /// The reply to the `WAIT` that follows a grant on a member asked to wait for replicas
    /// (`?wait=N`): whether the reply just before it counts.
    Wait,
    /// The reply to the `WAITAOF` that follows a grant (after its `WAIT`, if any) on a member
    /// asked to wait for append-only fsyncs (`?waitaof=L,R`): whether the grant counts.
    WaitAof,
}

impl Slot {
    pub fn redo(&self) -> Option<Redo> {
        match *self {
            Slot::Reply { redo, .. } | Slot::Discard { redo, .. } => redo,
            _ => None,
        }
    }

    /// This slot for its command written again at `now` (on a new connection, or to the node
    /// that serves its slot now): the owner, if it still waits, gets the reply from there,
    /// and its node timeout still counts from when the command was first written (a node that
    /// refuses every reconnect must not keep the owner waiting).
    pub fn resent(self, now: Instant) -> Slot {
        match self {
            Slot::Reply {
                caller,
                run,
                tag,
                redo,
                due,
                fired,
                ..
            } => Slot::Reply {
                caller,
                run,
                tag,
                sent: now,
                redo,
                due,
                fired,
            },
            other => other,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No socket. A new connect may start at `retry_at`.
    Down {
        retry_at: Instant,
    },
    /// Connect in progress since `since`; `linked` once the stream's own connect finished (a
    /// TLS handshake goes on).
    Connecting {
        since: Instant,
        linked: bool,
    },
    Up,
}

#[derive(Debug)]
pub(crate) struct Conn {
    /// Commands (replies owed in order), or pub/sub (every reply a push once set up).
    commands: bool,
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
    /// written yet (see [`mark_written`](Conn::mark_written)).
    unwritten: usize,
    /// How many slots at the front of `owed` need no timeout any more (answered slots leave;
    /// these are fired, or not replies to a caller): the next due one is at this index or
    /// after it. Dues grow along the queue, so the first one not fired is the earliest.
    checked: usize,
    /// How many setup replies are still owed; they come first in `owed`. While any is,
    /// queued commands wait in `held`.
    setup_owed: usize,
    /// Commands queued before the setup was answered, sent once it was, all of it OK.
    held: Vec<u8>,
    /// Whether `held` has commands other than compare-and-deletes sent again.
    held_fresh: bool,
    backoff: Duration,
    last_error: Option<NodeErrorKind>,
    /// The first error reply among the [`Slot::Before`] replies of the sequence being read,
    /// as received: a transaction that a node aborted (`EXECABORT`) for a refused command
    /// reports that refusal (`READONLY`, `MISCONF`, `OOM`, ...).
    before_error: Vec<u8>,
    /// The bytes of every compare-and-delete still owed a reply, in order; the first
    /// `redo_head` are answered already.
    redo: Vec<u8>,
    redo_head: usize,
    /// What this connection's setup has said of the server so far.
    pub learnt: Server,
    /// Which of the node's addresses the connect in progress is to (a host name may resolve
    /// to several; a connect that fails moves on to the next).
    pub trying: usize,
    /// How many replies this connection (and those before it) have read, in all.
    pub read: u64,
    /// Bytes were received on this connection.
    pub heard: bool,
}

impl Conn {
    pub fn new(commands: bool, now: Instant) -> Conn {
        Conn {
            commands,
            state: State::Down { retry_at: now },
            out: Vec::with_capacity(512),
            out_pos: 0,
            inp: Vec::new(),
            inp_pos: 0,
            inp_end: 0,
            owed: VecDeque::with_capacity(64),
            unwritten: 0,
            checked: 0,
            setup_owed: 0,
            held: Vec::new(),
            held_fresh: false,
            backoff: BACKOFF_MIN,
            last_error: None,
            before_error: Vec::new(),
            redo: Vec::new(),
            redo_head: 0,
            learnt: Server::default(),
            trying: 0,
            read: 0,
            heard: false,
        }
    }

    /// True when commands can be queued: connected, connecting, or due for a new connect.
    pub fn can_send(&self, now: Instant) -> bool {
        match self.state {
            State::Down { retry_at } => now >= retry_at,
            _ => true,
        }
    }

    /// When a connect may start again, while the connection is down.
    pub fn retry_at(&self) -> Option<Instant> {
        match self.state {
            State::Down { retry_at } => Some(retry_at),
            _ => None,
        }
    }

    /// When a connect in progress started.
    pub fn connecting_since(&self) -> Option<Instant> {
        match self.state {
            State::Connecting { since, .. } => Some(since),
            _ => None,
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

    /// The configuration error that closed this connection last, if that is why it is down
    /// or why it is being set up again: a refusal stands until a setup goes through, so a
    /// reconnect in flight never makes a misconfigured node look like one that may still vote
    /// (a wait would then end as contention, not as the configuration error it is).
    pub fn setup_error(&self) -> Option<&NodeErrorKind> {
        match &self.last_error {
            Some(e @ NodeErrorKind::Setup { .. }) if !self.is_ready() => Some(e),
            _ => None,
        }
    }

    /// Bytes queued but not yet written.
    pub fn has_pending_output(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// The bytes to write now.
    pub fn pending(&self) -> &[u8] {
        &self.out[self.out_pos..]
    }

    /// The replies still owed, oldest first.
    pub fn owed(&self) -> usize {
        self.owed.len()
    }

    /// Whether a reply to a caller's command is owed.
    pub fn owes_replies(&self) -> bool {
        self.owed
            .iter()
            .any(|s| matches!(s, Slot::Reply { .. } | Slot::Discard { .. }))
    }

    /// When the oldest reply still owed to a caller was queued, if any is owed.
    pub fn oldest_reply_since(&self) -> Option<Instant> {
        self.owed.iter().find_map(|s| match s {
            Slot::Reply { sent, .. } => Some(*sent),
            _ => None,
        })
    }

    /// The latest `until` of the compare-and-deletes still owed, if any is.
    pub fn redo_until(&self) -> Option<Instant> {
        self.owed
            .iter()
            .filter_map(|s| s.redo())
            .map(|r| r.until)
            .max()
    }

    /// Starts a connection at `now`: its setup is the first thing queued, and everything
    /// queued after it is held until the setup is answered. `sharded`: the node is a master
    /// of a Redis Cluster member, whose scripts announce with `SPUBLISH`.
    pub fn start(&mut self, node: &NodeAddr, sharded: bool, now: Instant) {
        debug_assert!(self.owed.is_empty() && self.out.is_empty() && self.held.is_empty());
        self.state = State::Connecting {
            since: now,
            linked: false,
        };
        self.heard = false;
        self.trying = 0;
        self.learnt = Server::default();
        if self.commands {
            // Sized once: both are empty here, and keep their capacity from one connection
            // to the next.
            self.owed.reserve(OWED_ROOM);
            self.redo.reserve(REDO_ROOM);
        }
        let owed = &mut self.owed;
        setup::write(&mut self.out, node, self.commands, sharded, |step| {
            owed.push_back(Slot::Setup(step))
        });
        self.setup_owed = self.owed.len();
    }

    /// The connect to the address being tried failed at `now`: moves on to the next of the
    /// node's `addresses`, with the setup (and what is held behind it) still queued, none of
    /// it having been sent. `false` when none is left.
    pub fn next_address(&mut self, addresses: usize, now: Instant) -> bool {
        if !matches!(self.state, State::Connecting { .. }) || self.trying + 1 >= addresses {
            return false;
        }
        self.trying += 1;
        self.state = State::Connecting {
            since: now,
            linked: false,
        };
        true
    }

    /// A connection that is down may connect again at once (its node's address changed: the
    /// backoff was for the old one).
    pub fn retry_now(&mut self, now: Instant) {
        if let State::Down { retry_at } = &mut self.state {
            *retry_at = (*retry_at).min(now);
        }
    }

    /// The stream's own connect finished; its TLS handshake goes on.
    pub fn linked(&mut self) {
        if let State::Connecting { linked, .. } = &mut self.state {
            *linked = true;
        }
    }

    /// Whether the stream is connected and its TLS handshake under way.
    pub fn is_handshaking(&self) -> bool {
        matches!(self.state, State::Connecting { linked: true, .. })
    }

    /// The connect finished. The backoff starts again from its least once the setup is
    /// answered, not here: a server that accepts connections and refuses every setup (a wrong
    /// password) is not worth reconnecting to every few milliseconds.
    pub fn connected(&mut self) {
        if let State::Connecting { .. } = self.state {
            self.state = State::Up;
            if self.setup_owed == 0 {
                self.backoff = BACKOFF_MIN;
            }
            // A refused setup stands until a setup goes through (see `setup_error`).
            if !matches!(self.last_error, Some(NodeErrorKind::Setup { .. })) {
                self.last_error = None;
            }
        }
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
    /// With `redo_until`, the commands are a compare-and-delete kept until answered, to be
    /// sent again on the next connection should this one break first.
    pub fn queue(
        &mut self,
        slot: Slot,
        redo_until: Option<Instant>,
        encode: impl FnOnce(&mut Vec<u8>) -> usize,
    ) {
        let held = self.setup_owed > 0;
        let buf = if held { &mut self.held } else { &mut self.out };
        let start = buf.len();
        let before = encode(buf);
        let redo = redo_until.map(|until| {
            let bytes = &buf[start..];
            keep(&mut self.redo, bytes);
            Redo {
                until,
                len: bytes.len() as u32,
                before: before as u32,
            }
        });
        // A topology read is the same whatever the server offers.
        self.held_fresh |= held && slot != Slot::Topology;
        self.push_slots(slot, before, redo);
    }

    /// Queues again a compare-and-delete that a broken connection of the same node owed:
    /// `bytes` with the replies `before` commands and then `slot` owe.
    pub fn queue_redo(&mut self, slot: Slot, redo: Redo, bytes: &[u8]) {
        self.queue_buf().extend_from_slice(bytes);
        keep(&mut self.redo, bytes);
        self.push_slots(slot, redo.before as usize, Some(redo));
    }

    fn push_slots(&mut self, slot: Slot, before: usize, redo: Option<Redo>) {
        for _ in 0..before {
            self.owed.push_back(Slot::Before);
        }
        let slot = match slot {
            Slot::Reply {
                caller,
                run,
                tag,
                sent,
                due,
                ..
            } => Slot::Reply {
                caller,
                run,
                tag,
                sent,
                redo,
                due,
                fired: false,
            },
            Slot::Discard { given, .. } => Slot::Discard { redo, given },
            other => other,
        };
        self.owed.push_back(slot);
        self.unwritten += 1 + before;
    }

    /// `n` bytes of [`pending`](Self::pending) were written.
    pub fn sent(&mut self, n: usize) {
        self.out_pos = (self.out_pos + n).min(self.out.len());
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// Once everything queued has been written (at `now`), the commands queued since the last
    /// call have left: the node's timeout for each counts from now, `node_timeout` (time spent
    /// queued in the client behind other callers' commands is not the node's slowness).
    pub fn mark_written(&mut self, now: Instant, node_timeout: Duration) {
        if self.unwritten == 0 || self.has_pending_output() || !self.held.is_empty() {
            return;
        }
        let n = self.unwritten.min(self.owed.len());
        self.unwritten = 0;
        let due_now = crate::engine::timings::node_deadline(now, node_timeout);
        let start = self.owed.len() - n;
        for slot in self.owed.range_mut(start..) {
            if let Slot::Reply { due, .. } = slot {
                *due = (*due).max(due_now);
            }
        }
    }

    /// Makes the reply still owed to the give-back of the holder with `token` (a
    /// [`Slot::Discard`] with that token) the reply to the transmit tagged `tag` of `caller`'s
    /// run `run`, as if queued at `now`: that holder's release, the same compare-and-delete,
    /// already on its way. It stays owed until `until` at least, the release's own (the
    /// holder may have extended what it deletes since the give-back was sent). Its node
    /// timeout counts from `now` (no later than that of a reply owed after it, so that dues
    /// still grow along the queue). Returns whether one was owed.
    pub fn adopt(
        &mut self,
        token: Token,
        (caller, run, tag): (u32, u64, Tag),
        until: Option<Instant>,
        now: Instant,
        node_timeout: Duration,
    ) -> bool {
        let Some(at) = self
            .owed
            .iter()
            .position(|s| matches!(s, Slot::Discard { given: Some(t), .. } if *t == token))
        else {
            return false;
        };
        let redo = self.owed[at].redo().map(|r| Redo {
            until: r.until.max(until.unwrap_or(r.until)),
            ..r
        });
        let later = self.owed.range(at + 1..).find_map(|s| match s {
            Slot::Reply { due, .. } => Some(*due),
            _ => None,
        });
        let due = crate::engine::timings::node_deadline(now, node_timeout);
        self.owed[at] = Slot::Reply {
            caller,
            run,
            tag,
            sent: now,
            redo,
            due: later.map_or(due, |l| l.min(due)),
            fired: false,
        };
        self.checked = self.checked.min(at);
        true
    }

    /// When the next command still unanswered and not yet timed out is due.
    pub fn next_due(&mut self) -> Option<Instant> {
        while let Some(slot) = self.owed.get(self.checked) {
            match slot {
                Slot::Reply {
                    due, fired: false, ..
                } => return Some(*due),
                _ => self.checked += 1,
            }
        }
        None
    }

    /// Hands `timed_out` every command due by `now` and not answered: its owner counts the
    /// node as timed out for it.
    pub fn fire_due(&mut self, now: Instant, mut timed_out: impl FnMut(&Slot)) {
        while let Some(due) = self.next_due() {
            if due > now {
                return;
            }
            let slot = &mut self.owed[self.checked];
            if let Slot::Reply { fired, .. } = slot {
                *fired = true;
            }
            timed_out(slot);
            self.checked += 1;
        }
    }

    /// Makes space to read into, at the end of the input buffer, by moving undecoded bytes to
    /// the front, or by growing the buffer, but never past what one reply within `limits` can
    /// need (a bigger one is refused by the decoder before that).
    pub fn make_room(&mut self, limits: &Limits) -> Result<(), NodeErrorKind> {
        let cap = limits
            .max_bulk
            .saturating_add(limits.max_line)
            .saturating_add(READ_CHUNK);
        if self.inp_end == self.inp.len() {
            if self.inp_pos > 0 {
                self.inp.copy_within(self.inp_pos..self.inp_end, 0);
                self.inp_end -= self.inp_pos;
                self.inp_pos = 0;
            }
            if self.inp_end == self.inp.len() {
                if self.inp.len() >= cap {
                    // A reply bigger than the codec will ever accept: only a broken server.
                    return Err(NodeErrorKind::UnexpectedReply);
                }
                let grow = self.inp.len().max(READ_CHUNK).min(cap - self.inp.len());
                self.inp.resize(self.inp.len() + grow, 0);
            }
        }
        Ok(())
    }

    /// The space [`make_room`](Self::make_room) made at the end of the input buffer.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.inp[self.inp_end..]
    }

    /// `n` bytes were read into [`recv_buf`](Self::recv_buf).
    pub fn received(&mut self, n: usize) {
        self.inp_end = (self.inp_end + n).min(self.inp.len());
        self.heard |= n > 0;
    }

    /// Frames every complete reply received and hands each, with the slot it answers, its
    /// bytes, for a compare-and-delete the bytes of its commands (else nothing), and whether
    /// a `WAIT` answers next (see [`Slot::Wait`]), to `handle`; setup replies are checked here (and teach [`learnt`](Self::learnt)).
    /// Returns `Ok(true)` when this call answered the last setup reply: the caller then looks
    /// at what the setup said, and [`release_held`](Self::release_held)s what waited behind it.
    ///
    /// A setup reply that shows the node's URL or configuration to be wrong, or any reply
    /// during the setup that is not RESP, fails with a [`NodeErrorKind::Setup`].
    pub fn take_replies(
        &mut self,
        limits: &Limits,
        mut handle: impl FnMut(Slot, &[u8], &[u8], bool),
    ) -> Result<bool, NodeErrorKind> {
        let mut set_up = false;
        loop {
            let input = &self.inp[self.inp_pos..self.inp_end];
            if input.is_empty() {
                break;
            }
            let used = match resp::scan(input, limits) {
                Ok(Status::Complete(used)) => used,
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
            };
            let bytes = &input[..used];
            self.read += 1;
            let slot = match self.owed.pop_front() {
                Some(slot) => {
                    self.unwritten = self.unwritten.min(self.owed.len());
                    self.checked = self.checked.saturating_sub(1);
                    slot
                }
                None if !self.commands => Slot::Push,
                None => return Err(NodeErrorKind::UnexpectedReply),
            };
            let redo_len = slot.redo().map_or(0, |r| r.len as usize);
            let command = self.redo_head..(self.redo_head + redo_len).min(self.redo.len());
            match slot {
                Slot::Setup(step) => {
                    let reply = decoded(bytes, limits)?;
                    step.check(&reply)?;
                    match (step, &reply) {
                        (Setup::Info, Reply::Bulk(Some(text))) => self.learnt.read_info(text),
                        (Setup::Caps, _) => self.learnt.set_caps(&reply),
                        _ => {}
                    }
                    self.setup_owed = self.setup_owed.saturating_sub(1);
                    if self.setup_owed == 0 {
                        set_up = true;
                        self.backoff = BACKOFF_MIN;
                        self.last_error = None;
                    }
                }
                Slot::Before => {
                    if self.before_error.is_empty() && bytes.first() == Some(&b'-') {
                        self.before_error.extend_from_slice(bytes);
                    }
                }
                Slot::Reply { .. } | Slot::Discard { .. }
                    if !self.before_error.is_empty() && bytes.starts_with(b"-EXECABORT") =>
                {
                    // The transaction was discarded because a command in it was refused: the
                    // refusal is what the vote reports.
                    let waits = matches!(self.owed.front(), Some(Slot::Wait | Slot::WaitAof));
                    handle(slot, &self.before_error, &self.redo[command], waits);
                }
                _ => {
                    let waits = matches!(self.owed.front(), Some(Slot::Wait | Slot::WaitAof));
                    handle(slot, bytes, &self.redo[command], waits)
                }
            }
            if slot.redo().is_some() {
                self.redo_head += redo_len;
                if self.redo_head >= self.redo.len() {
                    self.redo.clear();
                    self.redo_head = 0;
                } else if self.redo_head * 2 >= self.redo.len() {
                    // Half of it answered: the rest moves to the front, so the buffer stays
                    // as large as the most ever owed at once, never more.
                    self.redo.drain(..self.redo_head);
                    self.redo_head = 0;
                }
            }
            if !matches!(slot, Slot::Before) {
                self.before_error.clear();
            }
            self.inp_pos += used;
        }
        if self.inp_pos == self.inp_end {
            self.inp_pos = 0;
            self.inp_end = 0;
        }
        Ok(set_up)
    }

    /// Whether commands other than compare-and-deletes sent again wait behind the setup.
    pub fn holds_fresh_commands(&self) -> bool {
        self.held_fresh && !self.held.is_empty()
    }

    /// Sends what waited behind the setup, now answered and found good.
    pub fn release_held(&mut self) {
        self.held_fresh = false;
        if self.held.is_empty() {
            return;
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            std::mem::swap(&mut self.out, &mut self.held);
        } else {
            self.out.extend_from_slice(&self.held);
        }
        self.held.clear();
    }

    /// Drops the connection after `why`, at `now`: a new connect may start after the backoff.
    /// Hands every slot still owed to `owed`, oldest first, with the bytes to send again for
    /// those that are compare-and-deletes.
    pub fn fail(
        &mut self,
        why: NodeErrorKind,
        now: Instant,
        mut owed: impl FnMut(Slot, Option<&[u8]>),
    ) {
        let mut at = self.redo_head;
        for slot in self.owed.drain(..) {
            match slot.redo() {
                Some(redo) => {
                    let end = (at + redo.len as usize).min(self.redo.len());
                    owed(slot, Some(&self.redo[at..end]));
                    at = end;
                }
                None => owed(slot, None),
            }
        }
        self.redo.clear();
        self.redo_head = 0;
        self.out.clear();
        self.out_pos = 0;
        self.held.clear();
        self.held_fresh = false;
        self.setup_owed = 0;
        self.inp_pos = 0;
        self.inp_end = 0;
        self.before_error.clear();
        self.checked = 0;
        self.state = State::Down {
            retry_at: now + self.backoff,
        };
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.last_error = Some(why);
        self.unwritten = 0;
    }
}

/// Appends `bytes` to the redo buffer `redo`, growing it ahead of need (room for a few more
/// such commands, and at least double): how many compare-and-deletes are owed at once varies
/// with the nodes' pace, and each new high-water mark would otherwise cost an allocation.
fn keep(redo: &mut Vec<u8>, bytes: &[u8]) {
    if redo.capacity() - redo.len() < bytes.len() {
        redo.reserve(redo.len().max(4 * bytes.len()));
    }
    redo.extend_from_slice(bytes);
}

/// Why a node did not run a compare-and-delete it answered, when that is worth repeating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `NOSCRIPT`: its script cache was flushed; sent again at once with the script's body.
    NoScript,
    /// `BUSY` (a script running), `TRYAGAIN` (a slot mid-migration), `LOADING` (a restart
    /// loading its data), `CLUSTERDOWN` (a cluster mid-failover): it did nothing, and may do it
    /// a moment later (in a cluster, perhaps at another master, found by a topology read).
    /// A transaction aborted (`EXECABORT`) for one of these is one too.
    Transient,
    /// It ran, but the `WAIT` (or `WAITAOF`) after it said too few replicas (or fsyncs) have
    /// it: kept for the node's next connection, which may be to another master.
    Unacknowledged,
}

impl Refused {
    /// What `reply`, one framed reply, says of the compare-and-delete it answers.
    pub fn of(reply: &[u8]) -> Option<Refused> {
        let message = reply.strip_prefix(b"-")?;
        let message = message.strip_suffix(b"\r\n").unwrap_or(message);
        match ServerErrorKind::of(message) {
            ServerErrorKind::NoScript => Some(Refused::NoScript),
            ServerErrorKind::Busy
            | ServerErrorKind::TryAgain
            | ServerErrorKind::Loading
            | ServerErrorKind::ClusterDown => Some(Refused::Transient),
            _ => None,
        }
    }
}

/// `commands` (whole RESP arrays of bulk strings, as the client writes them) with every
/// `EVALSHA` of a script of ours made the `EVAL` of its body: what a node that answered
/// `NOSCRIPT` is sent again. `None` when there was nothing to rewrite (or the bytes are not
/// such commands).
pub(crate) fn with_bodies(commands: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(commands.len() + 1024);
    let mut rest = commands;
    let mut rewrote = false;
    while !rest.is_empty() {
        let (n, after) = number(rest.strip_prefix(b"*")?)?;
        let mut args: [&[u8]; 2] = [&[], &[]];
        let mut at = after;
        let mut first_two_end = 0;
        for k in 0..n {
            let (len, after) = number(at.strip_prefix(b"$")?)?;
            let arg = after.get(..len)?;
            at = after.get(len..)?.strip_prefix(b"\r\n")?;
            if let Some(a) = args.get_mut(k) {
                *a = arg;
                first_two_end = rest.len() - at.len();
            }
        }
        let used = rest.len() - at.len();
        let script = (n >= 2 && args[0].eq_ignore_ascii_case(b"EVALSHA"))
            .then(|| crate::engine::scripts::by_sha(args[1]))
            .flatten();
        match script {
            Some(script) => {
                crate::resp::write_array_len(&mut out, n);
                crate::resp::write_bulk(&mut out, b"EVAL");
                crate::resp::write_bulk(&mut out, script.body.as_bytes());
                out.extend_from_slice(&rest[first_two_end..used]);
                rewrote = true;
            }
            None => out.extend_from_slice(&rest[..used]),
        }
        rest = at;
    }
    rewrote.then_some(out)
}

/// The decimal number that `bytes` starts with, up to its CRLF, and what follows.
fn number(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let end = bytes.iter().position(|&b| b == b'\r')?;
    let n = std::str::from_utf8(&bytes[..end]).ok()?.parse().ok()?;
    Some((n, bytes[end..].strip_prefix(b"\r\n")?))
}

/// `bytes`, one complete reply already framed, decoded.
pub(crate) fn decoded<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Reply<'a>, NodeErrorKind> {
    match resp::decode(bytes, limits) {
        Ok(Status::Complete((reply, _))) => Ok(reply),
        Ok(Status::Partial) => Err(NodeErrorKind::UnexpectedReply),
        Err(e) => Err(NodeErrorKind::Protocol(e)),
    }
}
