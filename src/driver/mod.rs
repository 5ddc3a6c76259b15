//! The thin mio driver: the I/O shell around a client's [`Endpoint`].
//!
//! The endpoint (in the sans-IO engine) owns every connection's state and every decision about
//! it; this module only makes the system calls it asks for and moves bytes: it opens and closes
//! sockets ([`socket`]), writes what a connection has pending, reads what has arrived, polls for
//! readiness, and parks and wakes the threads that use the client.
//!
//! # Callers, leader and followers
//!
//! A client has one [`Shared`] driver, used by all its threads at once. Each thread running a
//! lock operation is a caller ([`Session`]) of the endpoint, with a mailbox there. A caller
//! steps its machine (the endpoint queues its commands on each node's connection, behind other
//! callers'), then writes what is queued if it leads or finds no leader; while another caller
//! leads, it leaves the writing to the leader, waking the leader's poll once, so that Redis
//! reads concurrent callers' commands in batches.
//!
//! Nobody runs a thread of their own for I/O. A caller that must wait becomes the leader if
//! there is none: it polls for everyone, reads every connection that is ready into the
//! endpoint, and unparks the callers the endpoint posted to (a caller is posted to once its
//! mailbox has what its machine needs to move on: see `Endpoint::is_ready`). The other callers
//! park until then, or until their deadline passes. When the leader's own operation is over it
//! steps down; if every other caller is parked, it unparks one, which leads from then on. With
//! a single caller there is no hand-off at all: it leads, and its system calls are those of a
//! private connection set. Who leads, who is parked, whom to wake and who leads next are
//! decided by the callers' seats (`engine::endpoint::seats`), without threads: this module
//! parks, unparks and spawns the threads those decisions name.
//!
//! What a caller does between its waits is the endpoint's caller loop
//! (`engine::endpoint::caller`), which the simulation runs too: among its rules, before a caller
//! acts on a passed deadline, every connection is read once more, so that a reply that came but
//! was not read yet is never taken for a timeout.
//!
//! # Across `fork()`
//!
//! The sockets belong to the process that opened them. A client used in a child process after
//! a `fork()` never reads or writes its parent's sockets (both would read each other's replies):
//! at its first use there, it makes a core of its own ([`PerProcess`]), with a poller and
//! connections of its own, and never waits on the parent's: a thread of the parent that was
//! inside the client at the fork does not exist in the child, and the parent's mutex may have
//! been copied locked. If it was not, the parent's sockets are closed in the child (without a
//! system call that could touch the parent's: no deregistration from the poller both share);
//! if it was, they are left as they are. The resender thread is per process too.
#![forbid(unsafe_code)]

#[cfg(all(test, shuttle))]
mod checker;
#[cfg(all(test, shuttle))]
use checker::net as socket;
#[cfg(not(all(test, shuttle)))]
mod socket;
pub(crate) mod sync;

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use mio::Token;
use sync::{AtomicBool, Cancellable, Events, Mutex, MutexGuard, Poll, Registration, Registry};
use sync::{Thread, TryLockError, Waker};

use crate::config::Config;
use crate::engine::endpoint::seats::RESEND_IDLE_LOOK;
use crate::engine::endpoint::seats::{Resender, ResenderTurn, Seats, Tend, Tending, Writer};
use crate::engine::endpoint::{Bits, CallerId, CallerLoop, ConnId, Endpoint, Io, Next, Probed};
use crate::engine::machine::Machine;
use crate::engine::Round;
use crate::error::NodeErrorKind;
use crate::process::PerProcess;
use crate::rng::OsEntropy;
use crate::stats::Recorder;
use crate::tls::TlsContext;
use crate::url::Target;
use socket::Socket;

/// The poll token of the shared [`Waker`]: no connection has it.
const WAKER: Token = Token(usize::MAX);

/// The seats a warm-up or a settling tends without (no caller sits then).
const NO_SEATS: Option<&Seats<Thread, Kept>> = None;

/// A client's connections, shared by every thread that uses it.
pub(crate) struct Shared {
    config: Arc<Config>,
    stats: Arc<Recorder>,
    /// The TLS configuration of `rediss://` nodes, when any node is one or TLS was set up.
    tls: Option<TlsContext>,
    /// The connections of each process that uses the client.
    local: PerProcess<Local>,
}

/// A client's connections in one process.
struct Local {
    core: Mutex<Core>,
    /// A child's core that could not learn its servers from its parent's (a thread held it at
    /// the fork): its first caller sets its connections up first, as `Client::build` does, so
    /// that commands are not written before the child knows what each server offers.
    unwarmed: AtomicBool,
}

/// The poller, held by the leader while it polls.
struct Poller {
    poll: Poll,
    events: Events,
    ready: Vec<usize>,
}

/// What a caller's operations reuse, kept in its seat between sessions.
#[derive(Default)]
struct Kept {
    entropy: Option<OsEntropy>,
    wakeups: Vec<Thread>,
    round: Option<Round>,
    spread: Duration,
}

struct Core {
    ep: Endpoint,
    /// The poller, while nobody polls with it.
    poll: Option<Poller>,
    /// The TLS configuration of `rediss://` nodes.
    tls: Option<TlsContext>,
    /// Registers sockets with the poller, from any thread, while the leader polls.
    registry: Registry,
    /// Wakes the leader's poll: for a cancel, or for commands a follower queued.
    waker: Option<Arc<Waker>>,
    /// The callers' seats: the leader, who is parked, the closings, the resender (a child
    /// after `fork()` starts with none).
    seats: Seats<Thread, Kept>,
    /// Sockets by [`ConnId::index`].
    sockets: Vec<Option<Socket>>,
    /// Kept between finishes, for the threads a finishing caller unparks.
    unparked: Vec<Thread>,
    /// Kept between flushes and late reads: the connections (or nodes) to go through.
    bits: Bits,
}

impl Shared {
    pub fn new(
        config: Arc<Config>,
        stats: Arc<Recorder>,
        tls: Option<TlsContext>,
    ) -> io::Result<Shared> {
        let core = Core::new(config.clone(), stats.clone(), tls.clone())?;
        let local = PerProcess::new(Local::new(core));
        #[cfg(all(test, shuttle))]
        checker::watch(local.first());
        Ok(Shared {
            config,
            stats,
            tls,
            local,
        })
    }

    /// The connections of this process: in a child after `fork()`, a core of its own, made at
    /// its first use there (see the module's documentation). One `getpid` per call: every
    /// entry point that may reach a socket (a session, a warm-up, a close) comes through here
    /// first.
    fn here(&self) -> io::Result<&Local> {
        self.local.here(|parent| {
            let mut fresh = Core::new(self.config.clone(), self.stats.clone(), self.tls.clone())?;
            // Never waited on: a thread that held it at the fork does not exist here.
            let old = match parent.core.try_lock() {
                Ok(core) => Some(core),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            let known = old.is_some();
            if let Some(mut old) = old {
                fresh.ep.adopt_servers(&old.ep);
                old.forget_sockets();
            }
            let local = Local::new(fresh);
            local.unwarmed.store(!known, Ordering::Release);
            Ok(local)
        })
    }

    /// Opens every command connection and waits, `timeout` at the most, for each to be
    /// set up (or to fail), so the first rounds do not spend their per-node timeout on TCP and
    /// setup. Nodes that are down only count against the quorum later; nodes whose setup was
    /// refused are listed by [`setup_failures`](Self::setup_failures).
    pub fn warm_up(&self, timeout: Duration) {
        if let Ok(local) = self.here() {
            local.warm_up(timeout);
        }
    }

    /// The nodes whose last connection was closed because its setup was refused (see
    /// [`NodeErrorKind::Setup`]), with the reason.
    pub fn setup_failures(&self) -> Vec<(usize, NodeErrorKind)> {
        self.here()
            .map(|local| local.lock().ep.setup_failures())
            .unwrap_or_default()
    }

    /// Waits until every node has answered what it was sent, and every release of a broken
    /// connection has been sent again and answered, or the endpoint gives up (see
    /// `Endpoint::begin_close`). Returns the nodes left with releases that are not known to
    /// have reached them.
    ///
    /// The closing thread is a caller like any other: it leads the polling if nobody does,
    /// and otherwise leaves it to the leader and looks again every 20 ms at most. Whoever
    /// sees the closing end (see `Seats::end_close`) ends it for every thread that waits in
    /// `close` at the time.
    pub fn close(this: &Arc<Shared>) -> io::Result<Vec<usize>> {
        Ok(Shared::session(this)?.tend(true))
    }

    /// A caller slot for this thread, for one or more operations in a row.
    pub fn session(this: &Arc<Shared>) -> io::Result<Session<'_>> {
        let local = this.here()?;
        if local.unwarmed.swap(false, Ordering::AcqRel) {
            local.warm_up(this.config.connect_timeout);
        }
        let mut core = local.lock();
        let c = &mut *core;
        let slot = c.seats.sit(&mut c.ep, sync::current());
        let kept = &mut c.seats.seat(slot).kept;
        let entropy = kept.entropy.take().unwrap_or_else(OsEntropy::new);
        Ok(Session {
            shared: this,
            local,
            slot,
            wakeups: std::mem::take(&mut kept.wakeups),
            entropy: Some(entropy),
            round: kept.round.take(),
            spread: kept.spread,
        })
    }
}

impl Local {
    /// See [`Shared::warm_up`]: the loop of `Tending::warm_up`.
    fn warm_up(&self, timeout: Duration) {
        let mut core = self.lock();
        let start = sync::now();
        core.ep.connect_all(start);
        core.do_io(start);
        let mut tending = Tending::warm_up(start, timeout);
        let mut now = start;
        loop {
            if tending.turn_starts() {
                now = sync::now();
            }
            match tending.next(NO_SEATS, &mut core.ep, now, false) {
                Tend::Timers => core.timers(now),
                Tend::Wait(timeout) => {
                    let Some(mut poller) = core.poll.take() else {
                        return;
                    };
                    drop(core);
                    let _ = poller.poll.poll(&mut poller.events, Some(timeout));
                    core = self.lock();
                    now = sync::now();
                    core.service_events(&mut poller, now);
                    core.poll = Some(poller);
                }
                Tend::EndClose | Tend::Done(_) => return,
            }
        }
    }

    fn new(core: Core) -> Local {
        Local {
            core: Mutex::new(core),
            unwarmed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits at most `timeout` for input (the caller's deadline, which includes the endpoint's
    /// timers): the leader (this caller, if nobody leads) polls and services for everyone; a
    /// follower parks until posted to.
    fn wait<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        slot: CallerId,
        timeout: Duration,
        wanted: usize,
        wakeups: &mut Vec<Thread>,
    ) -> MutexGuard<'a, Core> {
        if core.seats.lead(slot) {
            // What followers queued since the last poll goes out now, one write per node.
            let now = sync::now();
            core.flush_all(now);
            if core.ep.is_ready(slot, wanted) {
                core.notify(slot, wakeups);
                return self.unpark(core, wakeups);
            }
            let Some(mut poller) = core.poll.take() else {
                // Cannot happen: only the leader takes the poller, and puts it back.
                drop(core);
                sync::sleep(timeout.min(Duration::from_millis(1)));
                return self.lock();
            };
            core.seats.nudged = false;
            drop(core);
            if let Err(e) = poller.poll.poll(&mut poller.events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // The poller itself failed; nothing can be read. Sleep out the timeout
                    // rather than spin, and let the deadlines decide.
                    sync::sleep(timeout);
                }
            }
            let mut core = self.lock();
            let now = sync::now();
            core.service_events(&mut poller, now);
            core.poll = Some(poller);
            core.timers(now);
            core.notify(slot, wakeups);
            self.unpark(core, wakeups)
        } else {
            core.seats.seat(slot).parked = true;
            if core.ep.is_ready(slot, wanted) {
                // Posted to while it was not parked: enough is here already.
                core.seats.seat(slot).parked = false;
                return core;
            }
            drop(core);
            // The callers this one posted to (it read their replies, or wrote for them) are
            // woken before it sleeps itself: they are marked as not parked, and nobody else
            // will wake them.
            for t in wakeups.drain(..) {
                t.unpark();
            }
            sync::park_follower(timeout);
            let mut core = self.lock();
            core.seats.seat(slot).parked = false;
            core
        }
    }

    /// Unparks `wakeups` once the lock is let go (so that they do not wake only to block on it).
    fn unpark<'a>(
        &'a self,
        core: MutexGuard<'a, Core>,
        wakeups: &mut Vec<Thread>,
    ) -> MutexGuard<'a, Core> {
        if wakeups.is_empty() {
            return core;
        }
        drop(core);
        for t in wakeups.drain(..) {
            t.unpark();
        }
        self.lock()
    }
}

impl Drop for Local {
    /// Closing a socket with replies unread resets its connection, and the node then drops
    /// whatever of ours it had not read yet. A release returns at its quorum while slower
    /// nodes may still be working through a backlog: a program that ends right after its last
    /// release would lose what they were owed, and leave its keys there for the whole TTL. So
    /// the connections are closed once they owe nothing, or once the nodes that still owe stop
    /// making progress (see [`Shared::close`]).
    ///
    /// Only the process that made it drops it ([`PerProcess`]): a child never settles, nor
    /// closes, its parent's connections.
    fn drop(&mut self) {
        self.core
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .settle();
    }
}

/// One thread's use of a [`Shared`] driver: a caller slot, with what its operations reuse.
pub(crate) struct Session<'a> {
    shared: &'a Arc<Shared>,
    /// This process's connections.
    local: &'a Local,
    slot: CallerId,
    /// The threads this caller, as the leader, unparks after servicing.
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
            None => Round::new(self.shared.config.nodes.len(), sync::now(), None, None),
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

    /// Runs `m` until it has its outcome: steps it on the endpoint, writes and reads for it
    /// (and for everyone, as the leader), feeds it every deadline, and returns its outcome.
    pub fn drive<M: Machine>(&mut self, m: &mut M) -> M::Output {
        self.drive_cancellable(m, None)
    }

    /// Like [`drive`](Self::drive); when `cancel` is cancelled, `m` is told at once
    /// (`Machine::handle_cancel`), even while this thread is parked or polling.
    pub fn drive_cancellable<M: Machine>(
        &mut self,
        m: &mut M,
        cancel: Option<&dyn Cancellable>,
    ) -> M::Output {
        let shared = self.shared;
        let local = self.local;
        let slot = self.slot;
        let mut entropy = self.entropy.take().unwrap_or_else(OsEntropy::new);
        let mut core = local.lock();
        let run = core.ep.begin(slot);
        // Without a waker (the system refused one), the flag is still read at every wake-up.
        let registration =
            cancel.map(|c| Registration::new(c, core.waker.clone(), sync::current()));
        let mut lp = CallerLoop::new(slot, run);
        let mut now = sync::now();
        let outcome = loop {
            if lp.turn_starts() {
                now = sync::now();
            }
            let cancelled = cancel.is_some_and(|c| c.is_cancelled());
            let polled = core.seats.leader.is_some();
            match lp.next(&mut core.ep, m, now, &mut entropy, cancelled, polled) {
                Next::ReadLate => {
                    // Replies that came while nobody polled, and the pushes that must be read
                    // before commands go out (a `+switch-master`).
                    core.read_late(now);
                    core.read_first(now);
                }
                Next::Io => {
                    core.do_io(now);
                    core.write_or_leave(slot, now);
                    core.notify(slot, &mut self.wakeups);
                }
                Next::ReadAll => core.read_all(now),
                Next::Timers => {
                    core.do_io(now);
                    core.end_close(now);
                }
                Next::Again => {}
                Next::Wait { until, wanted } => {
                    let timeout = until.saturating_duration_since(now);
                    core = local.wait(core, slot, timeout, wanted, &mut self.wakeups);
                }
                Next::Done(outcome) => break outcome,
            }
        };
        let next = core.finish(slot, lp.run());
        let c = &mut *core;
        let (resender, start) = c.seats.resender_after(&c.ep, sync::now());
        drop(core);
        // Those it posted to on its last step are woken too, and the resender when something
        // is owed.
        for t in self.wakeups.drain(..).chain(next).chain(resender) {
            t.unpark();
        }
        if start {
            Shared::start_resender(shared, local);
        }
        drop(registration);
        self.entropy = Some(entropy);
        outcome
    }
}

impl Shared {
    /// Starts the thread that sees through the releases (and cleanups) still owed when no
    /// caller is left to drive them: a release that returned at its quorum must still reach
    /// the other nodes, be sent again on a new connection if its own broke, with its script's
    /// body if its node answers `NOSCRIPT`, after a moment if it answers `BUSY`, or to the
    /// master named by a `MOVED` or `ASK` on a cluster member. The thread leads the polling
    /// like any caller while something is owed (10 s at a time); then it stays parked, holding
    /// no reference to the client, until a caller that finishes with something owed wakes it,
    /// and ends once nothing was owed for a minute or the client is gone. Replies still to come
    /// on ready connections are left a short look (30 ms) to the next call, which reads them
    /// anyway, before the thread drives them (see `Seats::resender_turn`). So a steady
    /// flow of releases starts one thread, not one per release. It runs in the process that
    /// started it (threads do not cross a `fork()`), on that process's connections.
    fn start_resender(this: &Arc<Shared>, local: &Local) {
        let weak = Arc::downgrade(this);
        let started = sync::spawn("redlock-mux-resend", move || Shared::resender(weak));
        if started.is_err() {
            local.lock().seats.resender = Resender::None;
        }
    }

    /// The resender thread (see [`start_resender`](Self::start_resender)).
    fn resender(weak: std::sync::Weak<Shared>) {
        let mut idle_since = sync::now();
        loop {
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let Ok(local) = shared.here() else {
                return;
            };
            let mut core = local.lock();
            let c = &mut *core;
            let turn = c
                .seats
                .resender_turn(&c.ep, sync::current, sync::now(), idle_since);
            drop(core);
            let look = match turn {
                ResenderTurn::Quit => return,
                ResenderTurn::Work => {
                    let Ok(session) = Shared::session(&shared) else {
                        return;
                    };
                    session.tend(false);
                    idle_since = sync::now();
                    continue;
                }
                ResenderTurn::Look(look) => {
                    // Something is owed: it is not idle.
                    idle_since = sync::now();
                    look
                }
                ResenderTurn::Idle => RESEND_IDLE_LOOK,
            };
            // Parked without a reference: dropping the client's last handle closes it there
            // and then, as if this thread did not exist.
            drop(shared);
            sync::park_timeout(look);
        }
    }
}

impl Session<'_> {
    /// The resender thread's work (see [`Shared::start_resender`]), or a close (see
    /// [`Shared::close`]): the loop of `Tending`, which says what to do at each turn.
    fn tend(mut self, close: bool) -> Vec<usize> {
        let local = self.local;
        let slot = self.slot;
        let mut core = local.lock();
        let run = core.ep.begin(slot);
        let mut now = sync::now();
        let c = &mut *core;
        let mut tending = match close {
            true => Tending::close(&mut c.seats, &mut c.ep, slot, now),
            false => Tending::resend(now),
        };
        if close {
            core.do_io(now);
            core.write_or_leave(slot, now);
        }
        let left = loop {
            if tending.turn_starts() {
                now = sync::now();
            }
            let gone = Arc::strong_count(self.shared) <= 1;
            let c = &mut *core;
            match tending.next(Some(&c.seats), &mut c.ep, now, gone) {
                Tend::Timers => core.timers(now),
                Tend::EndClose => core.end_close(now),
                Tend::Wait(timeout) => {
                    core = local.wait(core, slot, timeout, usize::MAX, &mut self.wakeups);
                }
                Tend::Done(left) => break left,
            }
        };
        let next = core.finish(slot, run);
        drop(core);
        for t in self.wakeups.drain(..).chain(next) {
            t.unpark();
        }
        left
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let mut core = self.local.lock();
        // An operation that unwound (a panic) did not finish: it must not stay the leader, or
        // keep its channels and mailbox.
        let next = core.abandon(self.slot);
        core.seats.seat(self.slot).kept = Kept {
            entropy: self.entropy.take(),
            wakeups: std::mem::take(&mut self.wakeups),
            round: self.round.take(),
            spread: self.spread,
        };
        core.seats.leave(self.slot);
        drop(core);
        if let Some(t) = next {
            t.unpark();
        }
    }
}

impl Core {
    fn new(config: Arc<Config>, stats: Arc<Recorder>, tls: Option<TlsContext>) -> io::Result<Core> {
        let n = config.nodes.len();
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER).ok().map(Arc::new);
        let now = sync::now();
        Ok(Core {
            ep: Endpoint::new(config, stats, now),
            poll: Some(Poller {
                poll,
                events: Events::with_capacity(64.max(n * 4)),
                ready: Vec::with_capacity(64.max(n * 4)),
            }),
            registry,
            tls,
            waker,
            seats: Seats::new(),
            sockets: (0..2 * n).map(|_| None).collect(),
            unparked: Vec::new(),
            bits: Bits::with_room(2 * n),
        })
    }

    /// Lets go of every socket without deregistering it, and of the poller and its waker: in a
    /// child after `fork()`, the poller is shared with the parent, and a deregistration would
    /// remove the parent's registration. Closing this process's descriptors leaves the
    /// parent's connections as they were. The core is never used again.
    fn forget_sockets(&mut self) {
        // Dropping a socket only closes its descriptor; nothing here deregisters.
        self.sockets.clear();
        self.poll = None;
        self.waker = None;
    }

    /// Ends the closing under way once it is over (see `Seats::end_close`), for every caller
    /// waiting in [`Shared::close`], which are woken. Whichever thread sees the closing's end
    /// first ends it, so that the end is not taken for a timer still due.
    fn end_close(&mut self, now: Instant) {
        let mut wake = std::mem::take(&mut self.unparked);
        self.seats.end_close(&mut self.ep, now, &mut wake);
        for t in wake.drain(..) {
            t.unpark();
        }
        self.unparked = wake;
    }

    /// Makes the system calls the endpoint asks for.
    fn do_io(&mut self, now: Instant) {
        while let Some(io) = self.ep.poll_io() {
            match io {
                Io::Connect(id) => {
                    // A cluster member's links are added as its topology names masters.
                    if self.sockets.len() <= id.index() {
                        self.sockets.resize_with(id.index() + 1, || None);
                    }
                    if let Some(old) = self.sockets[id.index()].take() {
                        old.close(&self.registry);
                    }
                    let session = match self.tls_session(id) {
                        Ok(session) => session,
                        Err(why) => {
                            self.ep.handle_connect_failed(id, why, now);
                            continue;
                        }
                    };
                    let target = self.ep.connect_addr(id);
                    let dead_after = self.ep.config().dead_peer_timeout;
                    let token = Token(id.index());
                    match Socket::connect(target, session, dead_after, &self.registry, token) {
                        Ok(s) => self.sockets[id.index()] = Some(s),
                        Err(e) => {
                            self.ep
                                .handle_connect_failed(id, NodeErrorKind::Connect(e.kind()), now)
                        }
                    }
                }
                Io::Close(id) => {
                    if let Some(s) = self.sockets.get_mut(id.index()).and_then(Option::take) {
                        s.close(&self.registry);
                    }
                }
                Io::Probe { id, timeout } => {
                    let found = self.probe(id, timeout);
                    self.ep.handle_probed(id, found, now);
                }
                Io::Resolve { member, switch } => {
                    let addr = self
                        .ep
                        .name_to_resolve(member, switch)
                        .and_then(|(host, port)| socket::resolve(host, port));
                    self.ep.handle_resolved(member, switch, addr, now);
                }
            }
        }
    }

    /// The TLS session for a connect of `id`, if its node is `rediss://`.
    fn tls_session(&self, id: ConnId) -> Result<Option<socket::Session>, NodeErrorKind> {
        let node_tls = self.ep.node_addr(id.node).tls;
        crate::tls::session_for(self.tls.as_ref(), node_tls, self.ep.tls_name(id))
    }

    /// Probes the server of `id` (see `Io::Probe`): blocking, `timeout` at most.
    fn probe(&self, id: ConnId, timeout: Duration) -> Probed {
        let Target::Tcp(addr) = self.ep.connect_addr(id) else {
            return Probed::Nothing;
        };
        if !self.ep.node_addr(id.node).tls {
            return match socket::answers_tls(addr, timeout) {
                true => Probed::AnswersTls,
                false => Probed::Nothing,
            };
        }
        #[cfg(feature = "tls")]
        if let Ok(Some(session)) = self.tls_session(id) {
            if let Some(why) = socket::tls_refusal(addr, session, timeout) {
                return Probed::Refused(why);
            }
        }
        Probed::Nothing
    }

    /// The connection `id` failed at the socket: it is closed, and the endpoint told.
    fn failed(&mut self, id: ConnId, why: NodeErrorKind, now: Instant) {
        let connecting = self.sockets[id.index()]
            .as_ref()
            .is_some_and(Socket::is_connecting);
        if let Some(s) = self.sockets[id.index()].take() {
            s.close(&self.registry);
        }
        if connecting {
            self.ep.handle_connect_failed(id, why, now);
        } else {
            self.ep.handle_failed(id, why, now);
        }
        self.do_io(now);
    }

    /// Writes what connection `id` has pending, as far as its socket takes it.
    fn flush(&mut self, id: ConnId, now: Instant) {
        let Some(s) = self.sockets[id.index()].as_mut() else {
            return;
        };
        if s.is_connecting() {
            return;
        }
        let written = s.write(self.ep.pending(id));
        match written {
            Ok(n) => {
                if n > 0 {
                    self.ep.handle_sent(id, n, now);
                }
                let output = self.ep.wants_write(id);
                if let Some(s) = self.sockets[id.index()].as_mut() {
                    if let Err(e) = s.update_interest(&self.registry, output) {
                        self.failed(id, NodeErrorKind::Io(e.kind()), now);
                    }
                }
            }
            Err(why) => self.failed(id, why, now),
        }
    }

    /// Writes what every connection has pending (those the endpoint says may have some).
    fn flush_all(&mut self, now: Instant) {
        let mut dirty = std::mem::take(&mut self.bits);
        self.ep.take_dirty(&mut dirty);
        while let Some(i) = dirty.pop_first() {
            let id = ConnId::from_index(i);
            if self.sockets.get(i).is_some_and(Option::is_some) && self.ep.wants_write(id) {
                self.flush(id, now);
            }
        }
        self.bits = dirty;
    }

    /// After a caller queued commands: it writes them, or leaves them to the leader (see
    /// `Seats::writer`).
    fn write_or_leave(&mut self, slot: CallerId, now: Instant) {
        match self
            .seats
            .writer(slot, self.waker.is_some(), self.poll.is_none())
        {
            Writer::Caller => self.flush_all(now),
            Writer::WakeLeader => {
                if self.waker.as_ref().is_some_and(|w| w.wake().is_err()) {
                    self.flush_all(now);
                }
            }
            Writer::Leader => {}
        }
    }

    /// Does whatever I/O connection `id` allows after a readiness event (or a read on
    /// suspicion): finishes a connect, writes what is pending, reads what has come.
    fn service(&mut self, id: ConnId, now: Instant) {
        let Some(s) = self.sockets[id.index()].as_mut() else {
            return;
        };
        match s.finish_connect() {
            Ok(true) => {
                if !self.ep.is_open(id) {
                    return;
                }
                self.ep.handle_connected(id);
            }
            Ok(false) => {
                if s.is_handshaking() {
                    self.ep.handle_linked(id);
                }
                return;
            }
            Err(why) => return self.failed(id, why, now),
        }
        self.flush(id, now);
        loop {
            let Some(s) = self.sockets[id.index()].as_mut() else {
                return;
            };
            let Some(buf) = self.ep.recv_buf(id, now) else {
                self.do_io(now);
                return;
            };
            match s.read(buf) {
                Ok(Some((n, drained))) => {
                    self.ep.handle_recv(id, n, now);
                    if drained {
                        break;
                    }
                }
                Ok(None) => break,
                Err(why) => return self.failed(id, why, now),
            }
        }
        self.do_io(now);
        // The setup was answered: what was held behind it goes out.
        if self.ep.wants_write(id) {
            self.flush(id, now);
        }
    }

    /// Services every connection that the poller reported ready.
    fn service_events(&mut self, poller: &mut Poller, now: Instant) {
        poller.ready.clear();
        for e in poller.events.iter() {
            if e.token() == WAKER {
                // A cancel, or commands to write: the caller's loop reads the handle, and
                // the leader writes what is queued.
                continue;
            }
            let i = e.token().0;
            if e.is_read_closed() || e.is_error() {
                // The peer's FIN may have come with the data: read to the end, not just until
                // a short read, or the hang-up is never seen.
                if let Some(Some(s)) = self.sockets.get_mut(i) {
                    s.hung_up();
                }
            }
            poller.ready.push(i);
        }
        for k in 0..poller.ready.len() {
            self.service(ConnId::from_index(poller.ready[k]), now);
        }
    }

    /// Reads every connection that is open, whether the poller reported it or not.
    fn read_all(&mut self, now: Instant) {
        for i in 0..self.sockets.len() {
            if self.sockets[i].is_some() {
                self.service(ConnId::from_index(i), now);
            }
        }
    }

    /// Reads the nodes whose oldest owed reply looks late (see `Endpoint::late_nodes`).
    fn read_late(&mut self, now: Instant) {
        let mut late = std::mem::take(&mut self.bits);
        self.ep.late_nodes(now, &mut late);
        while let Some(i) = late.pop_first() {
            self.service(
                ConnId {
                    node: i,
                    sub: false,
                },
                now,
            );
        }
        self.bits = late;
    }

    /// Reads the connections the endpoint wants read before commands go out (see
    /// `Endpoint::read_first`).
    fn read_first(&mut self, now: Instant) {
        let mut first = std::mem::take(&mut self.bits);
        self.ep.read_first(&mut first);
        while let Some(i) = first.pop_first() {
            if self.sockets.get(i).is_some_and(Option::is_some) {
                self.service(ConnId::from_index(i), now);
            }
        }
        self.bits = first;
    }

    /// Runs the endpoint's timers that are due (node timeouts, connect timeouts, reconnects for
    /// releases), after reading every connection: a reply that came is never taken for a
    /// timeout.
    fn timers(&mut self, now: Instant) {
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.read_all(now);
            self.ep.handle_timeout(now);
            self.do_io(now);
            self.flush_all(now);
            self.end_close(now);
        }
    }

    /// Collects into `wakeups` the threads of the callers the endpoint posted to that are
    /// parked (but `me`), now marked as not parked.
    fn notify(&mut self, me: CallerId, wakeups: &mut Vec<Thread>) {
        self.seats.notify(&mut self.ep, me, wakeups);
    }

    /// The caller's operation `run` is over: its mailbox closes, and a leader steps down,
    /// writing for the followers first. Returns the thread of a parked caller that must lead
    /// from now on (see `Seats::hand_over`), to be unparked once the lock is let go; the
    /// callers posted to are unparked now.
    #[must_use]
    fn finish(&mut self, slot: CallerId, run: u64) -> Option<Thread> {
        let now = sync::now();
        self.ep.finish(slot, run, now);
        let mut next = None;
        if self.seats.steps_down(slot) {
            // Nobody writes for the followers once the leader is gone.
            self.flush_all(now);
            next = self.seats.hand_over(&self.ep);
        }
        let mut wakeups = std::mem::take(&mut self.unparked);
        self.notify(slot, &mut wakeups);
        for t in wakeups.drain(..) {
            t.unpark();
        }
        self.unparked = wakeups;
        next
    }

    /// The threads of the callers with an operation under way that are not marked as parked:
    /// none of them may be parked (see `checker::watch`).
    #[cfg(all(test, shuttle))]
    fn marked_awake(&self) -> Vec<Thread> {
        self.seats.marked_awake(&self.ep)
    }

    /// A session ends: an operation it left unfinished (a panic unwound it) is finished now.
    fn abandon(&mut self, slot: CallerId) -> Option<Thread> {
        let run = self.ep.run_of(slot)?;
        self.finish(slot, run)
    }

    /// Writes what is queued and reads what is owed on every connection, and sends again the
    /// releases of broken connections, until the endpoint's closing is over: the loop of
    /// `Tending::settle`. Returns the nodes left with releases not known to have reached them.
    fn settle(&mut self) -> Vec<usize> {
        let mut now = sync::now();
        let mut tending = Tending::settle(&mut self.ep, now);
        self.do_io(now);
        self.flush_all(now);
        let Some(mut poller) = self.poll.take() else {
            // Another thread polls (it cannot, while this one closes): nothing to wait with.
            return self.ep.undelivered(now);
        };
        let left = loop {
            if tending.turn_starts() {
                now = sync::now();
            }
            match tending.next(NO_SEATS, &mut self.ep, now, false) {
                Tend::Timers => self.timers(now),
                Tend::Wait(timeout) => {
                    if let Err(e) = poller.poll.poll(&mut poller.events, Some(timeout)) {
                        if e.kind() != io::ErrorKind::Interrupted {
                            break self.ep.undelivered(now);
                        }
                    }
                    now = sync::now();
                    self.service_events(&mut poller, now);
                }
                Tend::EndClose => {}
                Tend::Done(left) => break left,
            }
        };
        self.poll = Some(poller);
        left
    }
}
