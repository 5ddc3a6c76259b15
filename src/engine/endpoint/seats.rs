//! The callers' seats in a threaded shell: which caller leads the polling, which are parked,
//! whom to wake and who leads next, the closings that callers wait for, and the resender's
//! state, with the rules that decide each. No thread, lock or clock here: the shell (the mio
//! driver) holds this beside the endpoint under its mutex, parks and unparks the threads these
//! decisions name, and makes the system calls. `T` is the shell's handle to a thread; `K` what
//! a seat's operations reuse.
//!
//! The rules, kept in one place:
//!
//! - A caller that must wait leads if nobody does; the leader polls and reads for everyone,
//!   the others park as followers until posted to.
//! - A caller posted to is woken only if it is parked (marked so), and marked awake at once:
//!   nobody else will wake it.
//! - A leader that finishes steps down; if every other caller is parked, one of them is woken
//!   to lead. A caller woken to lead that finishes without leading passes the wake-up on.
//! - Releases still owed once no caller is left are the resender's: started once, woken by a
//!   caller that finishes with something owed that cannot wait (see
//!   `Endpoint::tending_urgent`), stopped once nothing was owed for [`RESEND_LINGER`]. Replies
//!   still to come on a ready connection are left to the next call: the resender, parked for
//!   [`RESEND_LOOK`] at most while they are owed, drives them once it finds them still owed
//!   and no caller running at the end of a look. (A resender parked for [`RESEND_IDLE_LOOK`],
//!   as it is once nothing is owed, is woken for them too, to take that shorter look.)
//! - A closing under way is waited for as it is by every caller that closes meanwhile, and
//!   whoever sees its end ends it for all of them.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::{CallerId, Endpoint};

/// How long the thread that sends releases again runs at most, and how long it polls at a
/// time; how long it stays (parked) once nothing is owed, and how often it looks meanwhile
/// whether its client is gone.
const RESEND_LIMIT: Duration = Duration::from_secs(10);
const RESEND_POLL: Duration = Duration::from_millis(50);
const RESEND_LINGER: Duration = Duration::from_secs(60);
pub(crate) const RESEND_IDLE_LOOK: Duration = Duration::from_secs(1);
/// How long the resender stays parked at most while replies to compare-and-deletes are still
/// to come on ready connections: the next call reads them, and if none comes within it, the
/// resender does.
const RESEND_LOOK: Duration = Duration::from_millis(30);

/// How long a closing caller waits at most before it looks again whether every node answered:
/// while another caller leads, nobody posts to it when they do.
const CLOSE_LOOK: Duration = Duration::from_millis(20);

/// One caller's seat.
pub(crate) struct Seat<T, K> {
    /// The thread that uses it, while one does.
    pub thread: Option<T>,
    /// Parked as a follower (or about to be): whoever posts to it must wake it.
    pub parked: bool,
    /// What its operations reuse.
    pub kept: K,
}

/// The thread that drives the compare-and-deletes still owed while no caller runs.
pub(crate) enum Resender<T> {
    None,
    /// Spawned, not yet running.
    Starting,
    /// Running, or parked until a caller that finishes wakes it, or until the end of its look.
    Running(T),
}

/// What the resender thread does next (see [`Seats::resender_turn`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResenderTurn {
    /// Drive what is owed, as a caller.
    Work,
    /// Park a while: nothing is owed.
    Idle,
    /// Park this long at most: what is owed is only replies still to come, and a caller runs
    /// or the look is not over.
    Look(Duration),
    /// End: nothing was owed for [`RESEND_LINGER`].
    Quit,
}

/// Who writes the commands a caller queued (see [`Seats::writer`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Writer {
    /// The caller, now.
    Caller,
    /// The leader, whose poll the shell wakes (and, if it cannot, the caller writes).
    WakeLeader,
    /// The leader, whose poll was woken already (or is about to start).
    Leader,
}

/// Every caller's seat, the leader, the closings and the resender.
pub(crate) struct Seats<T, K> {
    seats: Vec<Seat<T, K>>,
    free: Vec<CallerId>,
    /// The caller that leads the polling, if any.
    pub leader: Option<CallerId>,
    /// The leader's poll was woken for queued commands since it last started polling.
    pub nudged: bool,
    /// The callers waiting for the closing under way.
    closers: Vec<CallerId>,
    /// How many closings have ended, and what the last one left undelivered: every caller
    /// that waited for it returns that.
    closes: u64,
    close_left: Vec<usize>,
    /// This process's resender thread.
    pub resender: Resender<T>,
    /// When the resender's short look ends, while it takes one (see [`ResenderTurn::Look`]).
    look_until: Option<Instant>,
}

impl<T: Clone, K: Default> Seats<T, K> {
    pub fn new() -> Seats<T, K> {
        Seats {
            seats: Vec::new(),
            free: Vec::new(),
            leader: None,
            nudged: false,
            closers: Vec::new(),
            closes: 0,
            close_left: Vec::new(),
            resender: Resender::None,
            look_until: None,
        }
    }

    /// A seat for `thread`: a free one, or that of a new caller of `ep`.
    pub fn sit(&mut self, ep: &mut Endpoint, thread: T) -> CallerId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = ep.open_caller();
                debug_assert_eq!(s, self.seats.len());
                self.seats.push(Seat {
                    thread: None,
                    parked: false,
                    kept: K::default(),
                });
                s
            }
        };
        self.seats[slot].thread = Some(thread);
        slot
    }

    /// The seat of `slot`.
    pub fn seat(&mut self, slot: CallerId) -> &mut Seat<T, K> {
        &mut self.seats[slot]
    }

    /// The thread of `slot` leaves its seat (its operation finished or abandoned): it is free.
    pub fn leave(&mut self, slot: CallerId) {
        if let Some(seat) = self.seats.get_mut(slot) {
            seat.thread = None;
            self.free.push(slot);
        }
    }

    /// Whether `slot` leads, taking the lead if nobody has it.
    pub fn lead(&mut self, slot: CallerId) -> bool {
        if self.leader.is_none() {
            self.leader = Some(slot);
        }
        self.leader == Some(slot)
    }

    /// Who writes the commands `slot` just queued: `slot` itself if it leads or nobody does;
    /// while another caller leads, they are left for the leader, whose poll is woken (once
    /// per poll, `polling`: the poller is out) to write everything queued on each connection
    /// in one system call. (`waker`: the shell can wake the poll.)
    pub fn writer(&mut self, slot: CallerId, waker: bool, polling: bool) -> Writer {
        match self.leader {
            Some(leader) if waker && leader != slot => {
                if polling && !self.nudged {
                    self.nudged = true;
                    return Writer::WakeLeader;
                }
                Writer::Leader
            }
            _ => Writer::Caller,
        }
    }

    /// Collects into `wakeups` the threads of the callers `ep` posted to that are parked (but
    /// `me`), now marked as not parked.
    pub fn notify(&mut self, ep: &mut Endpoint, me: CallerId, wakeups: &mut Vec<T>) {
        while let Some(c) = ep.poll_notified() {
            if c == me {
                continue;
            }
            if let Some(seat) = self.seats.get_mut(c) {
                if seat.parked {
                    seat.parked = false;
                    if let Some(t) = &seat.thread {
                        wakeups.push(t.clone());
                    }
                }
            }
        }
    }

    /// Whether `slot`, whose operation is over, steps down: it leads, or nobody does (a caller
    /// woken to lead that finishes without leading passes the wake-up on).
    pub fn steps_down(&self, slot: CallerId) -> bool {
        self.leader == Some(slot) || self.leader.is_none()
    }

    /// The leader stepped down (see [`steps_down`](Self::steps_down)): if every other caller
    /// with an operation under way is parked, one of them must lead from now on: its thread,
    /// marked awake, to be unparked once the lock is let go. A caller that runs (or was just
    /// unparked) will wait or finish soon, and so take over or pass it on.
    #[must_use]
    pub fn hand_over(&mut self, ep: &Endpoint) -> Option<T> {
        self.leader = None;
        if ep.active_callers().any(|c| !self.seats[c].parked) {
            return None;
        }
        let c = ep.active_callers().find(|&c| self.seats[c].parked)?;
        self.seats[c].parked = false;
        self.seats[c].thread.clone()
    }

    /// The threads of the callers with an operation under way that are not marked as parked:
    /// none of them may be parked.
    #[cfg(all(test, shuttle))]
    pub fn marked_awake(&self, ep: &Endpoint) -> Vec<T> {
        ep.active_callers()
            .filter(|&c| !self.seats[c].parked)
            .filter_map(|c| self.seats[c].thread.clone())
            .collect()
    }

    /// Whether releases wait to be sent again, or seen through, while no caller is left to
    /// drive them (see `Endpoint::needs_tending`).
    pub fn needs_resender(&self, ep: &Endpoint, now: Instant) -> bool {
        ep.active_callers().next().is_none() && ep.needs_tending(now)
    }

    /// After an operation finished: the resender's thread to wake, and whether one must be
    /// started (it is marked as starting), when something is owed that no caller drives. A
    /// resender taking a short look is left to it when what is owed is only replies still to
    /// come (see `Endpoint::tending_urgent`).
    pub fn resender_after(&mut self, ep: &Endpoint, now: Instant) -> (Option<T>, bool) {
        let resend = self.needs_resender(ep, now);
        match (&self.resender, resend) {
            (_, false) | (Resender::Starting, true) => (None, false),
            (Resender::Running(_), true)
                if self.look_until.is_some() && !ep.tending_urgent(now) =>
            {
                (None, false)
            }
            (Resender::Running(t), true) => (Some(t.clone()), false),
            (Resender::None, true) => {
                self.resender = Resender::Starting;
                (None, true)
            }
        }
    }

    /// What the resender thread `me` does next, idle since `idle_since`.
    pub fn resender_turn(
        &mut self,
        ep: &Endpoint,
        me: impl FnOnce() -> T,
        now: Instant,
        idle_since: Instant,
    ) -> ResenderTurn {
        if !matches!(self.resender, Resender::Running(_)) {
            self.resender = Resender::Running(me());
        }
        if ep.needs_tending(now) && !ep.tending_urgent(now) {
            // Only replies still to come: the next call reads them; once a whole look went by
            // without one, the resender does.
            let until = *self.look_until.get_or_insert(now + RESEND_LOOK);
            if now < until || ep.active_callers().next().is_some() {
                if now >= until {
                    self.look_until = Some(now + RESEND_LOOK);
                }
                let until = self.look_until.unwrap_or(now);
                return ResenderTurn::Look(until.saturating_duration_since(now));
            }
            self.look_until = None;
            return ResenderTurn::Work;
        }
        self.look_until = None;
        if self.needs_resender(ep, now) {
            return ResenderTurn::Work;
        }
        if now.saturating_duration_since(idle_since) >= RESEND_LINGER {
            self.resender = Resender::None;
            return ResenderTurn::Quit;
        }
        ResenderTurn::Idle
    }

    /// `slot` waits for a closing: the one under way, as it is, or one it begins. Returns how
    /// many closings had ended by then (see [`close_ended`](Self::close_ended)).
    pub fn join_close(&mut self, ep: &mut Endpoint, slot: CallerId, now: Instant) -> u64 {
        if self.closers.is_empty() {
            ep.begin_close(now);
        }
        self.closers.push(slot);
        self.closes
    }

    /// What the closing a caller joined after `ended` closings left undelivered, once it is
    /// over.
    pub fn close_ended(&self, ended: u64) -> Option<&[usize]> {
        (self.closes != ended).then_some(&self.close_left[..])
    }

    /// Ends the closing under way once it is over (see `Endpoint::close_outcome`), for every
    /// caller waiting for it: the parked ones are marked awake and their threads put in `wake`.
    pub fn end_close(&mut self, ep: &mut Endpoint, now: Instant, wake: &mut Vec<T>) {
        if self.closers.is_empty() {
            return;
        }
        let Some(left) = ep.close_outcome(now) else {
            return;
        };
        self.closes += 1;
        self.close_left = left;
        for c in std::mem::take(&mut self.closers) {
            if let Some(seat) = self.seats.get_mut(c) {
                if seat.parked {
                    seat.parked = false;
                    if let Some(t) = &seat.thread {
                        wake.push(t.clone());
                    }
                }
            }
        }
    }
}

/// What a loop that tends the client's connections with no machine of its own (the resender's
/// work, a close, a warm-up, the settling of a dropped client) has the shell do next (see
/// [`Tending::next`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tend {
    /// Run the endpoint's timers that are due, after reading every connection.
    Timers,
    /// End the closing under way if it is over ([`Seats::end_close`]), waking its callers.
    EndClose,
    /// Wait this long at most for input: a caller leads the polling or parks; a warm-up or a
    /// settling polls, and services what the poller reports. The shell takes the time again.
    Wait(Duration),
    /// The loop is over: the nodes left with releases not known to have reached them (a
    /// close's or a settling's; none otherwise).
    Done(Vec<usize>),
}

#[derive(Debug, Clone, Copy)]
enum Tends {
    /// The resender's work, until then at most while something is owed.
    Resend { until: Instant },
    /// A caller's close, which joined after `ended` closings had ended (see
    /// [`Seats::close_ended`]).
    Close { ended: u64 },
    /// Every command connection opened and set up (or failed), until then at most.
    WarmUp { deadline: Instant },
    /// The last handle was dropped: everything owed is seen through, within the closing's
    /// own bound (see `Endpoint::begin_close`).
    Settle,
}

/// The loop of a shell that tends the client's connections with no machine of its own: the
/// resender's work, for [`RESEND_LIMIT`] at most while something is owed; a caller's close,
/// until the closing it joined is over; a warm-up, until every command connection is set up
/// (or failed) or its deadline passes; the settling of a dropped client, until its closing is
/// over. The rules:
///
/// - A caller that tends (the resender, a closer) runs the timers that are due first at each
///   turn (the closing's end among them), whoever leads: a follower's turn comes at least
///   every [`CLOSE_LOOK`] (a closer) or `RESEND_POLL` (the resender).
/// - A warm-up or a settling runs the timers after each poll; a warm-up whose deadline
///   passed runs them once more, so that what timed out by then is judged before it ends.
#[derive(Debug)]
pub(crate) struct Tending {
    tends: Tends,
    /// The turn's step: 0 the top, then 1 and 2.
    step: u8,
}

impl Tending {
    /// The resender's work, starting at `now`.
    pub fn resend(now: Instant) -> Tending {
        Tending::of(Tends::Resend {
            until: now + RESEND_LIMIT,
        })
    }

    /// `slot` closes the client: it joins the closing under way, as it is, or begins one (see
    /// [`Seats::join_close`]). The shell then makes the system calls and writes.
    pub fn close<T: Clone, K: Default>(
        seats: &mut Seats<T, K>,
        ep: &mut Endpoint,
        slot: CallerId,
        now: Instant,
    ) -> Tending {
        let ended = seats.join_close(ep, slot, now);
        Tending::of(Tends::Close { ended })
    }

    /// A warm-up that began at `start` (`Endpoint::connect_all`), for `timeout` at most: the
    /// connects' own timeouts count from the same instant, so that those that run out (a TLS
    /// handshake nobody answers) are judged before the warm-up ends.
    pub fn warm_up(start: Instant, timeout: Duration) -> Tending {
        Tending::of(Tends::WarmUp {
            deadline: start + timeout,
        })
    }

    /// The settling of a client whose last handle was dropped: its closing begins (see
    /// `Endpoint::begin_close`). The shell then makes the system calls and writes.
    pub fn settle(ep: &mut Endpoint, now: Instant) -> Tending {
        ep.begin_close(now);
        Tending::of(Tends::Settle)
    }

    fn of(tends: Tends) -> Tending {
        Tending { tends, step: 0 }
    }

    /// Whether the next call starts a turn: the shell takes the time again.
    pub fn turn_starts(&self) -> bool {
        self.step == 0
    }

    /// What the shell does next at `now`. `seats`: the callers' seats, which a close needs.
    /// `gone`: the client's last handle was dropped (the resender's work is let go, and the
    /// drop settles what is left, within its own bound).
    pub fn next<T: Clone, K: Default>(
        &mut self,
        seats: Option<&Seats<T, K>>,
        ep: &mut Endpoint,
        now: Instant,
        gone: bool,
    ) -> Tend {
        let step = self.step;
        self.step = 0;
        match (self.tends, step) {
            (Tends::Resend { until }, 0) => {
                if now >= until || !ep.needs_tending(now) || gone {
                    return Tend::Done(Vec::new());
                }
                self.step = 1;
                Tend::Timers
            }
            // Until the endpoint's next timer, at most a short poll.
            (Tends::Resend { .. }, _) => Tend::Wait(ep.poll_timeout().map_or(RESEND_POLL, |t| {
                t.saturating_duration_since(now).min(RESEND_POLL)
            })),
            (Tends::Close { .. }, 0) => {
                self.step = 1;
                Tend::Timers
            }
            (Tends::Close { ended }, _) => {
                let left = seats.and_then(|s| s.close_ended(ended));
                if let Some(left) = left {
                    return Tend::Done(left.to_vec());
                }
                if step == 1 {
                    self.step = 2;
                    return Tend::EndClose;
                }
                // The endpoint's next timer, between 1 ms and `CLOSE_LOOK`.
                Tend::Wait(
                    ep.poll_timeout()
                        .map_or(CLOSE_LOOK, |t| t.saturating_duration_since(now))
                        .clamp(Duration::from_millis(1), CLOSE_LOOK),
                )
            }
            (Tends::WarmUp { deadline }, 0) => {
                if ep.is_settled() {
                    return Tend::Done(Vec::new());
                }
                self.step = if now >= deadline { 2 } else { 1 };
                if now >= deadline {
                    // What timed out by now is judged before the warm-up ends.
                    return Tend::Timers;
                }
                let until = ep.poll_timeout().map_or(deadline, |t| t.min(deadline));
                Tend::Wait(until.saturating_duration_since(now))
            }
            (Tends::WarmUp { .. }, 1) | (Tends::Settle, 1) => Tend::Timers,
            (Tends::WarmUp { .. }, _) => Tend::Done(Vec::new()),
            (Tends::Settle, _) => {
                if let Some(left) = ep.close_outcome(now) {
                    return Tend::Done(left);
                }
                self.step = 1;
                Tend::Wait(
                    ep.poll_timeout()
                        .map_or(Duration::from_millis(1), |t| {
                            t.saturating_duration_since(now)
                        })
                        .max(Duration::from_millis(1)),
                )
            }
        }
    }
}
