//! The caller loop: how one caller runs its operation's machine over the endpoint, without
//! sockets, threads or a clock. The mio driver and the simulation both run it, so the
//! simulation runs every rule the driver applies.
//!
//! The shell asks [`CallerLoop::next`] what to do, does it, and asks again, until the machine
//! has its outcome. A turn steps the machine on the endpoint (everything in its mailbox, then
//! every command it transmits), has the shell make the system calls and write, then merges the
//! machine's deadline (its validity, a retry) with the endpoint's (a node timeout, a connect
//! timeout, a reconnect): whichever caller sees one pass acts on it. The rules:
//!
//! - Before a machine steps while nobody reads the connections for everyone (no leader
//!   polls), the nodes whose oldest owed reply looks late are read: replies that came but were
//!   not read yet must not make the slow-node breaker skip a node.
//! - Before a caller acts on a passed deadline, every connection is read once more: a reply
//!   that came but was not read yet is never taken for a timeout.
//! - A caller with nothing scheduled looks again every [`IDLE_LOOK`].
//!
//! A turn ends with a wait, a read of every connection, the timers, or mail that came during
//! the turn's own I/O: the shell takes the time again for the next one
//! ([`turn_starts`](CallerLoop::turn_starts)).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::{CallerId, Endpoint};
use crate::engine::machine::Machine;
use crate::rng::Entropy;

/// How long a caller waits at most without anything scheduled, before it looks again.
pub(crate) const IDLE_LOOK: Duration = Duration::from_millis(100);

/// What the shell does next for a caller, before it asks again.
#[derive(Debug)]
pub(crate) enum Next<O> {
    /// Read the nodes that [`Endpoint::late_nodes`] names.
    ReadLate,
    /// Make the system calls the endpoint asks for ([`Endpoint::poll_io`]), write what is
    /// queued, and wake the callers posted to.
    Io,
    /// Read every connection.
    ReadAll,
    /// The endpoint's timers ran: make the system calls it asks for (and end a closing that is
    /// over).
    Timers,
    /// Nothing to do: the turn is over (mail came during its I/O).
    Again,
    /// Wait until `until` at most, or until the caller's mailbox holds what its machine needs
    /// ([`Endpoint::is_ready`] with `wanted`).
    Wait { until: Instant, wanted: usize },
    /// The machine has its outcome: the shell finishes the run ([`Endpoint::finish`]).
    Done(O),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A turn starts: a cancel reaches the machine, late nodes are read.
    Top,
    /// The machine steps.
    Step,
    /// Mail, outcome and deadlines are looked at.
    Check,
}

/// One caller's loop over one operation (one run): see the module's documentation.
#[derive(Debug)]
pub(crate) struct CallerLoop {
    caller: CallerId,
    run: u64,
    phase: Phase,
    /// Every connection was read since a deadline was seen to pass.
    drained: bool,
    /// The machine was told of the cancel.
    cancelled: bool,
}

impl CallerLoop {
    /// The loop of `caller`'s operation `run` (from [`Endpoint::begin`]).
    pub fn new(caller: CallerId, run: u64) -> CallerLoop {
        CallerLoop {
            caller,
            run,
            phase: Phase::Top,
            drained: false,
            cancelled: false,
        }
    }

    /// The run this loop drives.
    pub fn run(&self) -> u64 {
        self.run
    }

    /// Whether the next call starts a turn: the shell takes the time again.
    pub fn turn_starts(&self) -> bool {
        self.phase == Phase::Top
    }

    /// What the shell does next for machine `m` at `now`. `cancel`: the operation was
    /// cancelled (the machine is told once). `read_for_all`: someone reads every connection as
    /// replies come (a leader polls), so late nodes need no read of their own.
    pub fn next<M: Machine>(
        &mut self,
        ep: &mut Endpoint,
        m: &mut M,
        now: Instant,
        rng: &mut dyn Entropy,
        cancel: bool,
        read_for_all: bool,
    ) -> Next<M::Output> {
        // Each arm moves on by one phase at least: bounded.
        loop {
            match self.phase {
                Phase::Top => {
                    if cancel && !self.cancelled {
                        self.cancelled = true;
                        m.handle_cancel(now, rng);
                    }
                    self.phase = Phase::Step;
                    if !read_for_all {
                        // Replies that came while nobody polled are read before the slow-node
                        // breaker judges a node by them.
                        return Next::ReadLate;
                    }
                }
                Phase::Step => {
                    ep.step(self.caller, self.run, m, now, rng);
                    self.phase = Phase::Check;
                    return Next::Io;
                }
                Phase::Check => {
                    self.phase = Phase::Top;
                    return self.check(ep, m, now, rng);
                }
            }
        }
    }

    /// After the step and its I/O: mail, outcome, deadlines.
    fn check<M: Machine>(
        &mut self,
        ep: &mut Endpoint,
        m: &mut M,
        now: Instant,
        rng: &mut dyn Entropy,
    ) -> Next<M::Output> {
        if ep.has_mail(self.caller) {
            return Next::Again;
        }
        if let Some(outcome) = m.poll_outcome() {
            return Next::Done(outcome);
        }
        // The machine's own deadline (its validity, a retry), and the endpoint's (a node
        // timeout, a reconnect): whichever caller sees one pass acts on it.
        let mine = m.poll_timeout();
        let endpoint = ep.poll_timeout();
        let deadline = match (mine, endpoint) {
            (Some(a), Some(b)) => a.min(b),
            (Some(t), None) | (None, Some(t)) => t,
            // Nothing scheduled: the machine waits for input that must come (a reply, a
            // failure); look again now and then all the same.
            (None, None) => now + IDLE_LOOK,
        };
        if now < deadline {
            self.drained = false;
            return Next::Wait {
                until: deadline,
                wanted: m.replies_wanted(),
            };
        }
        if !self.drained {
            // What came but was not read yet is no timeout.
            self.drained = true;
            return Next::ReadAll;
        }
        self.drained = false;
        let timers = endpoint.is_some_and(|t| now >= t);
        if timers {
            ep.handle_timeout(now);
        }
        if mine.is_some_and(|t| now >= t) {
            m.handle_timeout(now, rng);
        }
        if timers {
            Next::Timers
        } else {
            Next::Again
        }
    }
}
