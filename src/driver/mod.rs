//! The thin mio driver: it pumps bytes and time for engine state machines ([`Machine`]), and
//! knows nothing of lock kinds.
//!
//! A client has one [`Shared`] driver, used by all its threads at once: one pipelined command
//! connection per node, and one subscriber connection per node for wake-ups. What is I/O stays
//! here: connects, the connection setup that gates every command (`conn`), buffers, reconnects
//! with backoff, and the order of commands.
//!
//! # Callers, leader and followers
//!
//! Each thread running a lock operation is a caller ([`Session`]), with a mailbox in the shared
//! core. A caller queues its commands on each node's connection: commands of concurrent
//! callers are pipelined behind each other, and a connection owes its replies in order, so
//! each queued slot names the caller (and its run) the reply goes to. A caller that leads, or
//! finds no leader, writes them at once; while another caller leads, they are left for the
//! leader, which writes everything queued on a connection in one system call before it polls
//! again (its poll is woken for that), so that Redis reads concurrent callers' commands in
//! batches.
//!
//! Nobody runs a thread of their own for I/O. A caller that must wait becomes the leader if
//! there is none: it polls for everyone, reads every connection that is ready, and posts each
//! reply, failure, wake message and confirmation to its owner's mailbox, unparking the owner.
//! The other callers park until their mailbox has what their machine needs to move on (the
//! replies that can decide its round, [`Machine::replies_wanted`], or any failure, error reply
//! or wake message) or their deadline passes: one wake-up per round, not one per reply. When
//! the leader's own operation is over it steps down. A caller that is running takes over when
//! it next waits; if every caller is parked, the leader unparks one, which leads from then on.
//! With a single caller there is no hand-off at all: it leads, and its system calls are those
//! of a private connection set.
//!
//! # Deadlines
//!
//! A command may wait in its connection's output behind other callers' (or behind a setup).
//! The machine is told when it was written ([`Machine::handle_written`]), so that the node's
//! timeout counts from then, while the lock's validity still counts from the round's start.
//! Before a caller acts on a passed deadline, every connection is read once more, so that a
//! reply that came but was not dispatched yet is never taken for a timeout.
//!
//! # Order
//!
//! A guard's release and extensions go out on the same connections as its acquisition, after
//! it: Redis runs the commands of one connection in order, so they can never overtake the
//! acquisition's command on any node. A reconnect fails every slot still owed on the broken
//! connection, for its owner; nothing is ever matched to a reply of another connection.
//!
//! # Wake-ups
//!
//! Subscriptions are counted per channel: the first caller of a channel subscribes the
//! subscriber connections to it, the last one unsubscribes them. A published message goes to
//! the callers of its channel only. A caller is told it is subscribed once every confirmation
//! owed for its channels on every node has come (or that node's subscriber connection failed).
#![forbid(unsafe_code)]

mod conn;

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Registry, Waker};

use crate::config::Config;
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::Caps;
use crate::engine::Round;
use crate::error::NodeErrorKind;
use crate::options::Cancel;
use crate::resp::{self, Reply, Status};
use crate::rng::OsEntropy;
use crate::stats::Recorder;
use conn::{Conn, Role, Slot};

/// The run id that no operation gets: a free caller slot has it.
const NO_RUN: u64 = 0;

/// A command connection whose oldest owed reply is this many node timeouts late is reset.
const WEDGED: u32 = 4;
/// ... and at least this late.
const WEDGED_MIN: Duration = Duration::from_millis(200);

/// Tells the caller that writes a command that it has left: `(node, tag, at)`.
type Written<'a> = dyn FnMut(usize, Tag, Instant) + 'a;

/// The poll token of the shared [`Waker`]: no connection has it.
const WAKER: mio::Token = mio::Token(usize::MAX);

/// A client's connections, shared by every thread that uses it.
pub(crate) struct Shared {
    core: Mutex<Core>,
    config: Arc<Config>,
    /// Wakes the leader's poll when a [`Cancel`] handle is cancelled.
    waker: Option<Arc<Waker>>,
}

/// The poller, held by the leader while it polls.
struct Poller {
    poll: Poll,
    events: Events,
    ready: Vec<usize>,
}

struct Core {
    /// The poller, while nobody polls with it.
    poll: Option<Poller>,
    /// Registers the connections with the poller, from any thread, while the leader polls.
    registry: Registry,
    /// The caller slot of the leader, if any.
    leader: Option<usize>,
    /// Wakes the leader's poll (shared with [`Shared::waker`]): a follower that queued
    /// commands for the leader to write uses it.
    waker: Option<Arc<Waker>>,
    /// The leader's poll was woken for queued commands since it last started polling.
    nudged: bool,
    /// Command connections: node `i` has poll token `i`.
    conns: Vec<Conn>,
    /// Subscriber connections: node `i` has poll token `n + i`.
    subs: Vec<Conn>,
    channels: Vec<Channel>,
    mail: Mail,
    free: Vec<usize>,
    next_run: u64,
    /// Where subscription commands are written before they are read back for their channels.
    scratch: Vec<u8>,
    /// The last command encoded for every node, with the capabilities it was encoded for and
    /// the replies owed before its own: the next node with the same capabilities gets a copy.
    encoded: Encoded,
    config: Arc<Config>,
    /// The client's statistics: the driver times every reply it reads.
    stats: Arc<Recorder>,
}

/// The callers' mailboxes.
struct Mail {
    callers: Vec<Caller>,
    /// Callers posted to since they were last unparked.
    notify: Vec<usize>,
}

/// One caller slot: a thread running an operation, or free (reused by the next one).
struct Caller {
    /// The operation it runs; [`NO_RUN`] when free. Slots owed to an earlier run are dropped.
    run: u64,
    thread: Option<Thread>,
    parked: bool,
    /// Already in [`Mail::notify`].
    notified: bool,
    /// Replies its machine wants before it is worth unparking ([`Machine::replies_wanted`]).
    wanted: usize,
    /// Replies posted since it last read its mailbox, without unparking it.
    held: usize,
    events: Vec<Event>,
    /// The bytes of the replies and messages in `events`.
    data: Vec<u8>,
    /// Confirmations still owed for its subscriptions.
    awaiting: usize,
    /// It waits to be told its subscriptions are confirmed.
    await_subscribed: bool,
    /// The channels it holds a reference to.
    chans: Vec<usize>,
    /// Kept with the slot between operations, so the next one reuses them.
    entropy: Option<OsEntropy>,
    wakeups: Vec<Thread>,
    round: Option<Round>,
    spread: Duration,
}

impl Caller {
    fn new() -> Caller {
        Caller {
            run: NO_RUN,
            thread: None,
            parked: false,
            notified: false,
            wanted: 1,
            held: 0,
            events: Vec::with_capacity(16),
            data: Vec::with_capacity(256),
            awaiting: 0,
            await_subscribed: false,
            chans: Vec::new(),
            entropy: None,
            wakeups: Vec::new(),
            round: None,
            spread: Duration::ZERO,
        }
    }
}

/// What the leader (or the caller itself) posts to a caller's mailbox.
#[derive(Debug)]
enum Event {
    Reply {
        node: usize,
        tag: Tag,
        start: usize,
        end: usize,
    },
    Failure {
        node: usize,
        tag: Tag,
        why: NodeErrorKind,
    },
    Written {
        node: usize,
        tag: Tag,
        at: Instant,
    },
    Wake {
        node: usize,
        channel: (usize, usize),
        message: (usize, usize),
    },
    Subscribed,
}

/// A wake channel the subscriber connections are (being) subscribed to.
struct Channel {
    name: Vec<u8>,
    /// Callers holding it; unsubscribed when this drops to zero.
    refs: usize,
    /// The callers (slot, run) to wake on a message.
    waiters: Vec<(usize, u64)>,
    /// Per node, confirmations owed for the SUBSCRIBE commands sent.
    owed: Vec<u32>,
    /// Per node, the callers (slot, run) waiting for those confirmations.
    awaiting: Vec<Vec<(usize, u64)>>,
}

/// One transmit's bytes, encoded once for all the nodes that share capabilities.
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

impl Mail {
    /// The mailbox of the caller in `slot` if it still runs `run`.
    fn to(&mut self, slot: usize, run: u64) -> Option<&mut Caller> {
        let c = self.callers.get_mut(slot).filter(|c| c.run == run)?;
        if !c.notified {
            c.notified = true;
            self.notify.push(slot);
        }
        Some(c)
    }

    /// Posts without unparking: for news that only moves the caller's deadline later (a
    /// write), which it reads when it wakes anyway.
    fn post_quiet(&mut self, slot: usize, run: u64, event: Event) {
        if let Some(c) = self.callers.get_mut(slot).filter(|c| c.run == run) {
            c.events.push(event);
        }
    }

    fn post(&mut self, slot: usize, run: u64, event: Event) {
        if let Some(c) = self.to(slot, run) {
            c.events.push(event);
        }
    }

    /// Posts a reply. The owner is unparked once it has as many as its machine wants, or at
    /// an error reply (which may ask for more than a vote: a `NOSCRIPT` is answered with the
    /// script's body at once).
    fn post_reply(&mut self, slot: usize, run: u64, node: usize, tag: Tag, raw: &[u8]) {
        let Some(c) = self.callers.get_mut(slot).filter(|c| c.run == run) else {
            return;
        };
        let start = c.data.len();
        c.data.extend_from_slice(raw);
        c.events.push(Event::Reply {
            node,
            tag,
            start,
            end: c.data.len(),
        });
        c.held += 1;
        if c.held >= c.wanted || raw.first() == Some(&b'-') {
            self.to(slot, run);
        }
    }

    fn post_wake(&mut self, slot: usize, run: u64, node: usize, channel: &[u8], message: &[u8]) {
        if let Some(c) = self.to(slot, run) {
            let a = c.data.len();
            c.data.extend_from_slice(channel);
            let b = c.data.len();
            c.data.extend_from_slice(message);
            c.events.push(Event::Wake {
                node,
                channel: (a, b),
                message: (b, c.data.len()),
            });
        }
    }

    /// One confirmation the caller waited for has come (or will not).
    fn confirmed(&mut self, slot: usize, run: u64) {
        let Some(c) = self.callers.get_mut(slot).filter(|c| c.run == run) else {
            return;
        };
        c.awaiting = c.awaiting.saturating_sub(1);
        if c.awaiting == 0 && c.await_subscribed {
            c.await_subscribed = false;
            self.post(slot, run, Event::Subscribed);
        }
    }

    /// Collects into `out` the threads of every caller posted to and parked, except `me`, to
    /// be unparked once the lock is let go (so that they do not wake only to block on it).
    fn take_wakeups(&mut self, me: usize, out: &mut Vec<Thread>) {
        self.drain_notified(me, |t| out.push(t.clone()));
    }

    /// Unparks every caller posted to, except `me`.
    fn flush(&mut self, me: usize) {
        self.drain_notified(me, Thread::unpark);
    }

    /// Empties [`notify`](Self::notify), handing `wake` the thread of each caller in it that
    /// is parked (but `me`), now marked as not parked.
    fn drain_notified(&mut self, me: usize, mut wake: impl FnMut(&Thread)) {
        for k in 0..self.notify.len() {
            let slot = self.notify[k];
            let Some(c) = self.callers.get_mut(slot) else {
                continue;
            };
            c.notified = false;
            if slot != me && c.parked {
                c.parked = false;
                if let Some(t) = &c.thread {
                    wake(t);
                }
            }
        }
        self.notify.clear();
    }
}

impl Shared {
    pub fn new(config: Arc<Config>, stats: Arc<Recorder>) -> io::Result<Shared> {
        let n = config.nodes.len();
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER).ok().map(Arc::new);
        Ok(Shared {
            core: Mutex::new(Core {
                poll: Some(Poller {
                    poll,
                    events: Events::with_capacity(64.max(n * 4)),
                    ready: Vec::with_capacity(64.max(n * 4)),
                }),
                registry,
                leader: None,
                waker: waker.clone(),
                nudged: false,
                conns: (0..n).map(|i| Conn::new(i, Role::Commands)).collect(),
                subs: (0..n).map(|i| Conn::new(n + i, Role::Subscriber)).collect(),
                channels: Vec::new(),
                mail: Mail {
                    callers: Vec::new(),
                    notify: Vec::new(),
                },
                free: Vec::new(),
                next_run: NO_RUN + 1,
                scratch: Vec::new(),
                encoded: Encoded::default(),
                config: config.clone(),
                stats,
            }),
            config,
            waker,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens every command connection and waits, until `deadline` at the most, for each to be
    /// set up (or to fail), so the first rounds do not spend their per-node timeout on TCP and
    /// setup. Nodes that are down only count against the quorum later; nodes whose setup was
    /// refused are listed by [`setup_failures`](Self::setup_failures).
    pub fn warm_up(&self, deadline: Instant) {
        let mut core = self.lock();
        let now = Instant::now();
        for i in 0..core.conns.len() {
            let _ = core.prepare(i, now);
        }
        // Nothing reconnects here: a connection that went down has had its one try.
        let settled = |c: &Conn| c.is_down() || (c.is_ready() && c.owed() == 0);
        while !core.conns.iter().all(settled) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let Some(mut poller) = core.poll.take() else {
                return;
            };
            drop(core);
            let _ = poller.poll.poll(&mut poller.events, Some(deadline - now));
            core = self.lock();
            core.service_events(&mut poller, Instant::now());
            core.poll = Some(poller);
            core.mail.flush(usize::MAX);
        }
    }

    /// The nodes whose last connection was closed because its setup was refused (see
    /// [`NodeErrorKind::Setup`]), with the reason.
    pub fn setup_failures(&self) -> Vec<(usize, NodeErrorKind)> {
        self.lock()
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, c.setup_error()?.clone())))
            .collect()
    }

    /// A caller slot for this thread, for one or more operations in a row.
    pub fn session(&self) -> Session<'_> {
        let mut core = self.lock();
        let slot = match core.free.pop() {
            Some(s) => s,
            None => {
                core.mail.callers.push(Caller::new());
                core.mail.callers.len() - 1
            }
        };
        let c = &mut core.mail.callers[slot];
        c.thread = Some(thread::current());
        let entropy = c.entropy.take().unwrap_or_else(OsEntropy::new);
        let wakeups = std::mem::take(&mut c.wakeups);
        Session {
            shared: self,
            slot,
            wakeups,
            entropy: Some(entropy),
            round: c.round.take(),
            spread: c.spread,
        }
    }

    /// Waits at most `timeout` for input: the leader (this caller, if nobody leads) polls and
    /// dispatches for everyone; a follower parks until posted to.
    fn wait<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        slot: usize,
        timeout: Duration,
        wanted: usize,
        wakeups: &mut Vec<Thread>,
    ) -> MutexGuard<'a, Core> {
        if core.leader.is_none() {
            core.leader = Some(slot);
        }
        if core.leader == Some(slot) {
            // What followers queued since the last poll goes out now, one write per node.
            core.flush_queued(Instant::now());
            if !core.mail.notify.is_empty() {
                // A write failed: its owners hear of it now, not after the poll.
                if !core.mail.callers[slot].events.is_empty() {
                    core.mail.flush(slot);
                    return core;
                }
                core.mail.flush(slot);
            }
            let Some(mut poller) = core.poll.take() else {
                // Cannot happen: only the leader takes the poller, and puts it back.
                drop(core);
                thread::sleep(timeout.min(Duration::from_millis(1)));
                return self.lock();
            };
            core.nudged = false;
            drop(core);
            if let Err(e) = poller.poll.poll(&mut poller.events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // The poller itself failed; nothing can be read. Sleep out the timeout
                    // rather than spin, and let the deadlines decide.
                    thread::sleep(timeout);
                }
            }
            let mut core = self.lock();
            core.service_events(&mut poller, Instant::now());
            core.poll = Some(poller);
            core.mail.take_wakeups(slot, wakeups);
            if wakeups.is_empty() {
                return core;
            }
            drop(core);
            for t in wakeups.drain(..) {
                t.unpark();
            }
            self.lock()
        } else {
            let c = &mut core.mail.callers[slot];
            c.parked = true;
            c.wanted = wanted.max(1);
            if c.held >= c.wanted {
                // Posted to while it was not parked: enough is here already.
                c.parked = false;
                return core;
            }
            drop(core);
            thread::park_timeout(timeout);
            let mut core = self.lock();
            core.mail.callers[slot].parked = false;
            core
        }
    }
}

impl Drop for Shared {
    /// Closing a socket with replies unread resets its connection, and the node then drops
    /// whatever of ours it had not read yet. A release returns at its quorum while slower
    /// nodes may still be working through a backlog: a program that ends right after its last
    /// release would lose what they were owed, and leave its keys there for the whole TTL. So
    /// the connections are closed only once they owe nothing, or once the oldest reply owed
    /// would count as wedged ([`WEDGED`] node timeouts, at least [`WEDGED_MIN`]).
    fn drop(&mut self) {
        let limit = self
            .config
            .node_timeout
            .saturating_mul(WEDGED)
            .max(WEDGED_MIN);
        let deadline = Instant::now() + limit;
        self.core
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .settle(deadline);
    }
}

/// One thread's use of a [`Shared`] driver: a caller slot, with what its operations reuse.
pub(crate) struct Session<'a> {
    shared: &'a Shared,
    slot: usize,
    /// The threads this caller, as the leader, unparks after dispatching.
    wakeups: Vec<Thread>,
    entropy: Option<OsEntropy>,
    round: Option<Round>,
    /// The spread of retries after split votes that the last contended acquisition ended with:
    /// contention lasts longer than one acquisition, so the next one starts from it.
    pub spread: Duration,
}

impl Session<'_> {
    /// Storage for a machine's rounds over the client's nodes. Give it back with
    /// [`put_round`](Self::put_round) so the next machine reuses it.
    pub fn take_round(&mut self) -> Round {
        match self.round.take() {
            Some(r) => r,
            None => Round::new(
                self.shared.config.nodes.len(),
                Instant::now(),
                self.shared.config.node_timeout,
                None,
                None,
            ),
        }
    }

    /// Returns a round's storage for reuse.
    pub fn put_round(&mut self, round: Round) {
        self.round = Some(round);
    }

    /// What the machines of this session draw their tokens and jitter from.
    pub fn entropy(&mut self) -> &mut OsEntropy {
        self.entropy.get_or_insert_with(OsEntropy::new)
    }

    /// Runs `m` until it has its outcome: sends what it transmits, feeds it every reply, node
    /// failure, write, wake message and deadline, and returns its outcome.
    pub fn drive<M: Machine>(&mut self, m: &mut M) -> M::Output {
        self.drive_cancellable(m, None)
    }

    /// Like [`drive`](Self::drive); when `cancel` is cancelled, `m` is told at once
    /// ([`Machine::handle_cancel`]), even while this thread is parked or polling.
    pub fn drive_cancellable<M: Machine>(
        &mut self,
        m: &mut M,
        cancel: Option<&Cancel>,
    ) -> M::Output {
        let shared = self.shared;
        let slot = self.slot;
        let mut entropy = self.entropy.take().unwrap_or_else(OsEntropy::new);
        let node_timeout = shared.config.node_timeout;
        let mut core = shared.lock();
        let run = core.next_run;
        core.next_run += 1;
        {
            let c = &mut core.mail.callers[slot];
            c.run = run;
            c.events.clear();
            c.data.clear();
            c.awaiting = 0;
            c.await_subscribed = false;
        }
        // Without a waker (the system refused one), the flag is still read at every wake-up.
        let registration = cancel.map(|c| c.register(shared.waker.clone(), thread::current()));
        let mut cancelled = false;
        let mut drained = false;
        let outcome = loop {
            let now = Instant::now();
            if !cancelled && cancel.is_some_and(Cancel::is_cancelled) {
                cancelled = true;
                m.handle_cancel(now, &mut entropy);
            }
            core.deliver(slot, m, &mut entropy, now);
            core.send(slot, run, m, &mut entropy, now);
            core.mail.flush(slot);
            if !core.mail.callers[slot].events.is_empty() {
                continue;
            }
            if let Some(outcome) = m.poll_outcome() {
                break outcome;
            }
            // A machine that is not done always has a deadline; should one not, it still gets
            // its input.
            let deadline = m.poll_timeout().unwrap_or(now + node_timeout);
            if now >= deadline {
                if !drained {
                    // What came but was not dispatched yet is no timeout.
                    drained = true;
                    core.read_all(now);
                    core.reset_overdue(now);
                    core.mail.flush(slot);
                    continue;
                }
                drained = false;
                m.handle_timeout(now, &mut entropy);
                continue;
            }
            drained = false;
            let wanted = m.replies_wanted();
            core = shared.wait(core, slot, deadline - now, wanted, &mut self.wakeups);
        };
        let next = core.finish(slot, run);
        drop(core);
        if let Some(t) = next {
            t.unpark();
        }
        drop(registration);
        self.entropy = Some(entropy);
        outcome
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let mut core = self.shared.lock();
        // An operation that unwound (a panic) did not finish: it must not stay the leader, or
        // keep its channels and mailbox.
        let run = core.mail.callers[self.slot].run;
        let next = (run != NO_RUN)
            .then(|| core.finish(self.slot, run))
            .flatten();
        let c = &mut core.mail.callers[self.slot];
        c.entropy = self.entropy.take();
        c.wakeups = std::mem::take(&mut self.wakeups);
        c.round = self.round.take();
        c.spread = self.spread;
        c.thread = None;
        core.free.push(self.slot);
        drop(core);
        if let Some(t) = next {
            t.unpark();
        }
    }
}

impl Core {
    /// Makes sure node `i`'s command connection has a socket (connecting if due); a failure
    /// fails the connection and everything it owed.
    fn prepare(&mut self, i: usize, now: Instant) -> Result<(), NodeErrorKind> {
        let conn = &mut self.conns[i];
        if let Err(why) = conn.prepare(
            &self.registry,
            &self.config.nodes[i],
            now,
            self.config.connect_timeout,
        ) {
            self.fail(i, why.clone(), now);
            return Err(why);
        }
        Ok(())
    }

    /// Feeds the caller in `slot` everything in its mailbox.
    fn deliver<M: Machine>(
        &mut self,
        slot: usize,
        m: &mut M,
        entropy: &mut OsEntropy,
        now: Instant,
    ) {
        let limits = self.config.limits;
        let c = &mut self.mail.callers[slot];
        c.held = 0;
        if c.events.is_empty() {
            return;
        }
        let data = &c.data;
        for e in c.events.drain(..) {
            match e {
                Event::Reply {
                    node,
                    tag,
                    start,
                    end,
                } => match resp::decode(&data[start..end], &limits) {
                    Ok(Status::Complete((reply, _))) => {
                        m.handle_reply(node, tag, &reply, now, entropy)
                    }
                    // Decoded once already when it was read: cannot happen.
                    _ => m.handle_failure(node, tag, NodeErrorKind::UnexpectedReply, now, entropy),
                },
                Event::Failure { node, tag, why } => m.handle_failure(node, tag, why, now, entropy),
                Event::Written { node, tag, at } => m.handle_written(node, tag, at),
                Event::Wake {
                    node,
                    channel,
                    message,
                } => m.handle_wake(
                    node,
                    &data[channel.0..channel.1],
                    &data[message.0..message.1],
                    now,
                    entropy,
                ),
                Event::Subscribed => m.handle_subscribed(now, entropy),
            }
        }
        c.data.clear();
    }

    /// Sends every transmit `m` has.
    fn send<M: Machine>(
        &mut self,
        slot: usize,
        run: u64,
        m: &mut M,
        entropy: &mut OsEntropy,
        now: Instant,
    ) {
        while let Some(t) = m.poll_transmit() {
            self.encoded.for_caps = None;
            match t.to {
                To::All => {
                    for i in 0..self.conns.len() {
                        self.send_to(i, &t, m, slot, run, entropy, now);
                    }
                }
                To::Node(i) if i < self.conns.len() => {
                    self.send_to(i, &t, m, slot, run, entropy, now)
                }
                To::Node(_) => {}
                To::Subscribers => match t.what {
                    What::Unsubscribe => self.unsubscribe(slot, run),
                    _ => self.subscribe(&t, m, slot, run, now),
                },
            }
        }
    }

    /// Sends `t` to node `i`'s command connection, behind whatever other callers queued there.
    /// A tagged transmit that cannot be sent is a failure of that node, at once; an untagged
    /// one (a cleanup) goes only where something of ours can be: to a connection that is up,
    /// or still owes replies.
    #[allow(clippy::too_many_arguments)]
    fn send_to<M: Machine>(
        &mut self,
        i: usize,
        t: &Transmit,
        m: &mut M,
        slot: usize,
        run: u64,
        entropy: &mut OsEntropy,
        now: Instant,
    ) {
        let conn = &mut self.conns[i];
        let Some(tag) = t.tag else {
            if !conn.can_send(now) || conn.owed() == 0 && !conn.is_up() {
                // Down, or never got the round's command: nothing of ours can be there.
                return;
            }
            let caps = conn.caps;
            let encoded = &mut self.encoded;
            conn.queue(Slot::Discard, |out| {
                encoded.write(caps, out, |out| m.encode(t, caps, out))
            });
            if !self.leave_to_leader(slot) {
                self.write(
                    i,
                    now,
                    Some((slot, run, &mut |n, tag, at| m.handle_written(n, tag, at))),
                );
            }
            return;
        };
        if !conn.can_send(now) {
            let why = conn.down_reason();
            m.handle_failure(i, tag, why, now, entropy);
            return;
        }
        if matches!(t.what, What::Acquire { .. }) && self.lagging(i, now) {
            // Behind a backlog that is already past the node timeout, a new acquisition would
            // only time out, and deepen the backlog: callers that win at the quorum without
            // this node would otherwise send it more than it can answer, without end. It
            // counts as timed out at once; releases and cleanups still go.
            m.handle_failure(i, tag, NodeErrorKind::Timeout, now, entropy);
            return;
        }
        if let Err(why) = self.prepare(i, now) {
            m.handle_failure(i, tag, why, now, entropy);
            return;
        }
        let conn = &mut self.conns[i];
        let caps = conn.caps;
        let encoded = &mut self.encoded;
        conn.queue(
            Slot::Reply {
                run,
                caller: slot as u32,
                tag,
                sent: now,
            },
            |out| encoded.write(caps, out, |out| m.encode(t, caps, out)),
        );
        if self.leave_to_leader(slot) {
            return;
        }
        // Write now, read later: every node gets its command before any reply is read.
        self.write(
            i,
            now,
            Some((slot, run, &mut |n, tag, at| m.handle_written(n, tag, at))),
        );
    }

    /// Whether node `i`'s command connection still owes a reply to a command queued more than
    /// the node timeout ago, once what has come was read.
    fn lagging(&mut self, i: usize, now: Instant) -> bool {
        let timeout = self.config.node_timeout;
        let late = |c: &Conn| {
            c.oldest_reply_since()
                .is_some_and(|sent| now.saturating_duration_since(sent) >= timeout)
        };
        if !late(&self.conns[i]) {
            return false;
        }
        // The replies may be here, unread: nobody polls while no caller waits.
        self.service(i, now);
        late(&self.conns[i])
    }

    /// True when another caller leads: then the commands the caller in `slot` just queued
    /// are left in the connection's output, and the leader writes everything queued on each
    /// connection in one system call before it polls again (waking its poll if it is in
    /// it), so that concurrent callers' commands reach each node in batches. A caller that
    /// leads, or finds no leader, writes at once.
    fn leave_to_leader(&mut self, slot: usize) -> bool {
        match (self.leader, &self.waker) {
            (Some(leader), Some(waker)) if leader != slot => {
                // The poller is out: the leader polls, or is about to, or has just come back
                // (then the wake-up only makes its next poll return at once).
                if self.poll.is_none() && !self.nudged {
                    self.nudged = true;
                    if waker.wake().is_err() {
                        return false;
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Writes what the followers left queued on every command connection.
    fn flush_queued(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            if self.conns[i].has_pending_output() {
                self.write(i, now, None);
            }
        }
    }

    /// Writes what node `i`'s command connection has queued, and tells the owners of the
    /// commands that left (`me`, the caller writing, directly).
    fn write(&mut self, i: usize, now: Instant, me: Option<(usize, u64, &mut Written<'_>)>) {
        let limits = self.config.limits;
        let conn = &mut self.conns[i];
        if let Err(why) = conn.drive(&self.registry, &limits, false) {
            self.fail(i, why, now);
            return;
        }
        let mail = &mut self.mail;
        let mut me = me;
        conn.take_written(|s| {
            if let Slot::Reply {
                run, caller, tag, ..
            } = *s
            {
                match &mut me {
                    Some((slot, my_run, written)) if *slot == caller as usize && *my_run == run => {
                        written(i, tag, now)
                    }
                    _ => mail.post_quiet(
                        caller as usize,
                        run,
                        Event::Written {
                            node: i,
                            tag,
                            at: now,
                        },
                    ),
                }
            }
        });
    }

    /// Closes node `i`'s command connection and fails every reply it still owed, for its
    /// owner.
    fn fail(&mut self, i: usize, why: NodeErrorKind, now: Instant) {
        let owed = self.conns[i].fail(&self.registry, why.clone(), now);
        for slot in owed {
            if let Slot::Reply {
                run, caller, tag, ..
            } = slot
            {
                self.mail.post(
                    caller as usize,
                    run,
                    Event::Failure {
                        node: i,
                        tag,
                        why: why.clone(),
                    },
                );
            }
        }
    }

    /// Writes what is queued and reads what is owed on every command connection, until none
    /// owes anything or `deadline` passes.
    fn settle(&mut self, deadline: Instant) {
        self.flush_queued(Instant::now());
        let Some(mut poller) = self.poll.take() else {
            return;
        };
        let busy = |c: &Conn| !c.is_down() && (c.owed() > 0 || c.has_pending_output());
        while self.conns.iter().any(busy) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if let Err(e) = poller.poll.poll(&mut poller.events, Some(deadline - now)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    break;
                }
            }
            self.service_events(&mut poller, Instant::now());
        }
        self.poll = Some(poller);
    }

    /// Services every connection that the poller reported ready.
    fn service_events(&mut self, poller: &mut Poller, now: Instant) {
        let n = self.conns.len();
        poller.ready.clear();
        for e in poller.events.iter() {
            if e.token() == WAKER {
                // A cancel: the caller's loop reads the handle.
                continue;
            }
            let token = e.token().0;
            if e.is_read_closed() || e.is_error() {
                // The peer's FIN may have come with the data: read to the end, not just until
                // a short read, or the hang-up is never seen.
                let conn = match token.checked_sub(n) {
                    None => self.conns.get_mut(token),
                    Some(i) => self.subs.get_mut(i),
                };
                if let Some(conn) = conn {
                    conn.hung_up();
                }
            }
            poller.ready.push(token);
        }
        for k in 0..poller.ready.len() {
            let token = poller.ready[k];
            match token.checked_sub(n) {
                None => self.service(token, now),
                Some(i) => self.service_subscriber(i, now),
            }
        }
    }

    /// Reads every connection that is up, whether the poller reported it or not.
    fn read_all(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            if self.conns[i].is_up() {
                self.service(i, now);
            }
            if self.subs[i].is_up() {
                self.service_subscriber(i, now);
            }
        }
    }

    /// Resets every command connection whose oldest owed reply is long overdue (its command
    /// was queued [`WEDGED`] node timeouts ago, at least [`WEDGED_MIN`], and every connection
    /// was just read). A reply that is only late is read and dropped when it comes, as every
    /// late reply is: a loaded machine must not reset connections, and so fail every caller's
    /// replies on them, at each late reply. Redis answers
    /// every command of a connection in order and TCP loses nothing, so such a connection is
    /// wedged, or something between us and the node drops replies: then every later reply
    /// would be matched to the wrong command. Every reply it owed fails, for its owner, and the
    /// next command reconnects.
    fn reset_overdue(&mut self, now: Instant) {
        let timeout = self
            .config
            .node_timeout
            .saturating_mul(WEDGED)
            .max(WEDGED_MIN);
        for i in 0..self.conns.len() {
            let overdue = self.conns[i]
                .oldest_reply_since()
                .is_some_and(|sent| now.saturating_duration_since(sent) >= timeout);
            if overdue {
                self.fail(i, NodeErrorKind::Timeout, now);
            }
        }
    }

    /// Does whatever I/O node `i`'s command connection allows, and posts each reply to its
    /// owner.
    fn service(&mut self, i: usize, now: Instant) {
        let limits = self.config.limits;
        let registry = &self.registry;
        let conn = &mut self.conns[i];
        let mail = &mut self.mail;
        let stats = &self.stats;
        let mut result = conn.drive(registry, &limits, true).and_then(|()| {
            conn.take_replies(&limits, |slot, _, raw| {
                if let Slot::Reply {
                    run,
                    caller,
                    tag,
                    sent,
                } = slot
                {
                    // Every reply is timed, the late ones too: a round decided at the quorum
                    // must not hide the slowest node's latency.
                    stats.reply(i, now.saturating_duration_since(sent));
                    // A straggler of a finished run: nobody waits for it any more.
                    mail.post_reply(caller as usize, run, i, tag, raw);
                }
            })
        });
        if result.is_ok() && conn.has_pending_output() {
            // The setup was answered: send what was held behind it.
            result = conn.drive(registry, &limits, false);
        }
        match result {
            Ok(()) => conn.take_written(|s| {
                if let Slot::Reply {
                    run, caller, tag, ..
                } = *s
                {
                    mail.post_quiet(
                        caller as usize,
                        run,
                        Event::Written {
                            node: i,
                            tag,
                            at: now,
                        },
                    );
                }
            }),
            Err(why) => self.fail(i, why, now),
        }
    }

    /// Does whatever I/O node `i`'s subscriber connection allows: confirmations are counted,
    /// messages posted to the callers of their channel.
    fn service_subscriber(&mut self, i: usize, now: Instant) {
        let limits = self.config.limits;
        let registry = &self.registry;
        let sub = &mut self.subs[i];
        let mail = &mut self.mail;
        let channels = &mut self.channels;
        let mut result = sub.drive(registry, &limits, true).and_then(|()| {
            sub.take_replies(&limits, |_, reply, _| {
                let Reply::Array(Some(items)) = reply else {
                    return;
                };
                let (Some(Reply::Bulk(Some(kind))), Some(Reply::Bulk(Some(name)))) =
                    (items.first(), items.get(1))
                else {
                    return;
                };
                let Some(ch) = channels.iter_mut().find(|c| c.name == *name) else {
                    return;
                };
                match *kind {
                    b"message" => {
                        let message = match items.get(2) {
                            Some(Reply::Bulk(Some(m))) => *m,
                            _ => &[],
                        };
                        for &(slot, run) in &ch.waiters {
                            mail.post_wake(slot, run, i, name, message);
                        }
                    }
                    b"subscribe" => {
                        if let Some(owed) = ch.owed.get_mut(i) {
                            *owed = owed.saturating_sub(1);
                            if *owed == 0 {
                                for (slot, run) in ch.awaiting[i].drain(..) {
                                    mail.confirmed(slot, run);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            })
        });
        if result.is_ok() && sub.has_pending_output() {
            // The setup was answered: send the subscriptions held behind it.
            result = sub.drive(registry, &limits, false);
        }
        if let Err(why) = result {
            self.fail_subscriber(i, why, now);
        }
    }

    /// Closes node `i`'s subscriber connection. A lost subscriber only costs wake-ups (the
    /// retry delay is the backstop); its confirmations will not come, so nobody waits for
    /// them. The next subscription reconnects it, and resubscribes every live channel.
    fn fail_subscriber(&mut self, i: usize, why: NodeErrorKind, now: Instant) {
        self.subs[i].fail(&self.registry, why, now);
        for ch in &mut self.channels {
            ch.owed[i] = 0;
            for (slot, run) in ch.awaiting[i].drain(..) {
                self.mail.confirmed(slot, run);
            }
        }
    }

    /// Subscribes the caller to the channels `m` writes for `t`: the channels nobody held yet
    /// are subscribed to on every subscriber connection that can take it. The caller is told
    /// it is subscribed once every confirmation owed for its channels has come.
    fn subscribe<M: Machine>(
        &mut self,
        t: &Transmit,
        m: &mut M,
        slot: usize,
        run: u64,
        now: Instant,
    ) {
        let n = self.subs.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        m.encode(t, Caps::default(), &mut scratch);
        let limits = self.config.limits;
        let mut rest = &scratch[..];
        while let Ok(Status::Complete((Reply::Array(Some(items)), used))) =
            resp::decode(rest, &limits)
        {
            rest = &rest[used..];
            for item in items.iter().skip(1) {
                let Reply::Bulk(Some(name)) = item else {
                    continue;
                };
                let idx = match self.channels.iter().position(|c| c.name == *name) {
                    Some(idx) => idx,
                    None => {
                        let reusable = self
                            .channels
                            .iter()
                            .position(|c| c.refs == 0 && c.owed.iter().all(|&o| o == 0));
                        let fresh = Channel {
                            name: name.to_vec(),
                            refs: 0,
                            waiters: Vec::new(),
                            owed: vec![0; n],
                            awaiting: (0..n).map(|_| Vec::new()).collect(),
                        };
                        match reusable {
                            Some(k) => {
                                self.channels[k] = fresh;
                                k
                            }
                            None => {
                                self.channels.push(fresh);
                                self.channels.len() - 1
                            }
                        }
                    }
                };
                if self.mail.callers[slot].chans.contains(&idx) {
                    continue;
                }
                self.mail.callers[slot].chans.push(idx);
                let ch = &mut self.channels[idx];
                ch.refs += 1;
                ch.waiters.push((slot, run));
                if ch.refs == 1 {
                    for i in 0..n {
                        self.subscribe_on(i, Some(idx), now);
                    }
                }
                let ch = &mut self.channels[idx];
                for i in 0..n {
                    if ch.owed[i] > 0 {
                        ch.awaiting[i].push((slot, run));
                        self.mail.callers[slot].awaiting += 1;
                    }
                }
            }
        }
        self.scratch = scratch;
        let c = &mut self.mail.callers[slot];
        if c.awaiting == 0 {
            c.await_subscribed = false;
            self.mail.post(slot, run, Event::Subscribed);
        } else {
            c.await_subscribed = true;
        }
    }

    /// Subscribes node `i`'s subscriber connection to channel `idx`, connecting it first if it
    /// is down and due (then every live channel is subscribed to).
    fn subscribe_on(&mut self, i: usize, idx: Option<usize>, now: Instant) {
        let sub = &mut self.subs[i];
        if !sub.can_send(now) {
            return;
        }
        let fresh = sub.is_down();
        if let Err(why) = sub.prepare(
            &self.registry,
            &self.config.nodes[i],
            now,
            self.config.connect_timeout,
        ) {
            self.fail_subscriber(i, why, now);
            return;
        }
        for (k, ch) in self.channels.iter_mut().enumerate() {
            let wanted = if fresh { ch.refs > 0 } else { Some(k) == idx };
            if wanted {
                sub.queue_unmatched(|out| {
                    resp::encode_command(out, &[b"SUBSCRIBE", &ch.name]);
                });
                ch.owed[i] += 1;
            }
        }
        if let Err(why) = sub.drive(&self.registry, &self.config.limits, false) {
            self.fail_subscriber(i, why, now);
        }
    }

    /// Drops the caller's references to its channels; those nobody holds any more are
    /// unsubscribed from.
    fn unsubscribe(&mut self, slot: usize, run: u64) {
        let c = &mut self.mail.callers[slot];
        c.await_subscribed = false;
        c.awaiting = 0;
        while let Some(idx) = self.mail.callers[slot].chans.pop() {
            let ch = &mut self.channels[idx];
            ch.refs = ch.refs.saturating_sub(1);
            ch.waiters.retain(|&w| w != (slot, run));
            for a in &mut ch.awaiting {
                a.retain(|&w| w != (slot, run));
            }
            if ch.refs > 0 {
                continue;
            }
            for i in 0..self.subs.len() {
                let sub = &mut self.subs[i];
                if sub.is_up() {
                    let name = &self.channels[idx].name;
                    sub.queue_unmatched(|out| {
                        resp::encode_command(out, &[b"UNSUBSCRIBE", name]);
                    });
                    if let Err(why) = sub.drive(&self.registry, &self.config.limits, false) {
                        self.fail_subscriber(i, why, Instant::now());
                    }
                }
            }
        }
    }

    /// The caller's operation is over: its channels are let go, its mailbox closed (replies
    /// still owed to it are dropped when they come), and a leader steps down. If every other
    /// caller is parked, one of them must lead from now on: its thread is returned, to be
    /// unparked once the lock is let go. A caller that runs (or was just unparked) will wait
    /// or finish soon, and so take over or pass it on: it needs no extra wake-up.
    #[must_use]
    fn finish(&mut self, slot: usize, run: u64) -> Option<Thread> {
        self.unsubscribe(slot, run);
        let c = &mut self.mail.callers[slot];
        c.run = NO_RUN;
        c.events.clear();
        c.data.clear();
        c.held = 0;
        let mut next = None;
        // A leader steps down; a caller woken to lead that finished without leading passes
        // the wake-up on, so that parked callers are never left without a leader.
        if self.leader == Some(slot) || self.leader.is_none() {
            // Nobody writes for the followers once the leader is gone.
            self.flush_queued(Instant::now());
            self.leader = None;
            let active = |c: &Caller| c.run != NO_RUN;
            let running = self.mail.callers.iter().any(|c| active(c) && !c.parked);
            if !running {
                if let Some(c) = self.mail.callers.iter_mut().find(|c| active(c) && c.parked) {
                    c.parked = false;
                    next = c.thread.clone();
                }
            }
        }
        self.mail.flush(slot);
        next
    }
}
