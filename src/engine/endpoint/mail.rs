//! The callers' mailboxes: what the endpoint routes to each caller's operation, held until
//! that caller's machine steps.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::engine::machine::{Machine, Tag};
use crate::error::NodeErrorKind;
use crate::resp::{Arrays, Limits};
use crate::rng::Entropy;

/// The run id that no operation gets: an idle caller has it.
const NO_RUN: u64 = 0;

/// What is posted to a caller's mailbox.
#[derive(Debug)]
pub(crate) enum Event {
    /// A reply, framed; its bytes are `data[start..end]` of the mailbox.
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
    Wake {
        node: usize,
        channel: (usize, usize),
        message: (usize, usize),
    },
    Subscribed,
}

/// One caller's mailbox.
#[derive(Debug)]
pub(crate) struct Caller {
    /// The operation it runs; [`NO_RUN`] when idle. What is posted for another run is dropped.
    run: u64,
    /// Already in [`Mail::notify`].
    notified: bool,
    /// Replies posted since its machine last stepped.
    held: usize,
    /// Replies its machine wants before it is worth waking (`Machine::replies_wanted`).
    wanted: usize,
    /// Something was posted since its machine last stepped that must reach it at once (a
    /// failure, an error reply, a wake message, a confirmation), not only replies.
    urgent: bool,
    events: Vec<Event>,
    /// The bytes of the replies and messages in `events`.
    data: Vec<u8>,
    /// Confirmations still owed for its subscriptions.
    pub awaiting: usize,
    /// It waits to be told its subscriptions are confirmed.
    pub await_subscribed: bool,
    /// The wake channels it holds a reference to.
    pub chans: Vec<usize>,
}

/// Every caller's mailbox.
#[derive(Debug, Default)]
pub(crate) struct Mail {
    callers: Vec<Caller>,
    /// Callers posted to since they were last named by [`poll_notified`](Mail::poll_notified).
    notify: Vec<usize>,
    next_notify: usize,
    /// The vectors of the replies' arrays, taken back after each reply is handled: the `EXEC`
    /// replies of the read-write lock on Redis 8 cost no allocation.
    arrays: Arrays,
}

impl Mail {
    pub fn open(&mut self) -> usize {
        self.callers.push(Caller {
            run: NO_RUN,
            notified: false,
            held: 0,
            wanted: 1,
            urgent: false,
            events: Vec::with_capacity(16),
            data: Vec::with_capacity(256),
            awaiting: 0,
            await_subscribed: false,
            chans: Vec::new(),
        });
        self.callers.len() - 1
    }

    pub fn begin(&mut self, caller: usize, run: u64) {
        let c = &mut self.callers[caller];
        c.run = run;
        c.events.clear();
        c.data.clear();
        c.held = 0;
        c.wanted = 1;
        c.urgent = false;
        c.awaiting = 0;
        c.await_subscribed = false;
    }

    pub fn finish(&mut self, caller: usize) {
        let c = &mut self.callers[caller];
        c.run = NO_RUN;
        c.events.clear();
        c.data.clear();
        c.held = 0;
        c.urgent = false;
    }

    pub fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.callers.len()).filter(|&i| self.callers[i].run != NO_RUN)
    }

    pub fn run_of(&self, caller: usize) -> Option<u64> {
        self.callers
            .get(caller)
            .map(|c| c.run)
            .filter(|&r| r != NO_RUN)
    }

    pub fn has_events(&self, caller: usize) -> bool {
        !self.callers[caller].events.is_empty()
    }

    /// See [`Endpoint::is_ready`](super::Endpoint::is_ready). Replies posted from now on
    /// notify the caller only once it has `wanted` of them.
    pub fn is_ready(&mut self, caller: usize, wanted: usize) -> bool {
        let c = &mut self.callers[caller];
        c.wanted = wanted.max(1);
        c.urgent || c.held >= c.wanted
    }

    pub fn poll_notified(&mut self) -> Option<usize> {
        while self.next_notify < self.notify.len() {
            let slot = self.notify[self.next_notify];
            self.next_notify += 1;
            if let Some(c) = self.callers.get_mut(slot) {
                c.notified = false;
                return Some(slot);
            }
        }
        self.notify.clear();
        self.next_notify = 0;
        None
    }

    /// The mailbox of `caller` if it still runs `run`, marked as posted to.
    pub fn to(&mut self, caller: usize, run: u64) -> Option<&mut Caller> {
        let c = self.callers.get_mut(caller).filter(|c| c.run == run)?;
        if !c.notified {
            c.notified = true;
            self.notify.push(caller);
        }
        Some(c)
    }

    pub fn post(&mut self, caller: usize, run: u64, event: Event) {
        if let Some(c) = self.to(caller, run) {
            c.urgent = true;
            c.events.push(event);
        }
    }

    /// Posts a reply. The owner is notified once it has as many as its machine wants (see
    /// [`is_ready`](Self::is_ready)), or at an error reply (which may ask for more than a
    /// vote: a `NOSCRIPT` is answered with the script's body at once).
    pub fn post_reply(&mut self, caller: usize, run: u64, node: usize, tag: Tag, raw: &[u8]) {
        let Some(c) = self.callers.get_mut(caller).filter(|c| c.run == run) else {
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
        c.urgent |= raw.first() == Some(&b'-');
        if c.urgent || c.held >= c.wanted {
            self.to(caller, run);
        }
    }

    pub fn post_wake(
        &mut self,
        caller: usize,
        run: u64,
        node: usize,
        channel: &[u8],
        message: &[u8],
    ) {
        if let Some(c) = self.to(caller, run) {
            c.urgent = true;
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

    /// The caller's mailbox, whatever it runs.
    pub fn caller(&mut self, caller: usize) -> &mut Caller {
        &mut self.callers[caller]
    }

    /// One confirmation the caller waited for has come (or will not).
    pub fn confirmed(&mut self, caller: usize, run: u64) {
        let Some(c) = self.callers.get_mut(caller).filter(|c| c.run == run) else {
            return;
        };
        c.awaiting = c.awaiting.saturating_sub(1);
        if c.awaiting == 0 && c.await_subscribed {
            c.await_subscribed = false;
            self.post(caller, run, Event::Subscribed);
        }
    }

    /// Feeds `caller`'s machine everything in its mailbox: each reply decoded (once, here).
    pub fn deliver<M: Machine>(
        &mut self,
        caller: usize,
        m: &mut M,
        limits: &Limits,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        let c = &mut self.callers[caller];
        c.held = 0;
        c.urgent = false;
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
                } => match super::decode_reply(&data[start..end], limits, &mut self.arrays) {
                    Ok(reply) => {
                        m.handle_reply(node, tag, &reply, now, rng);
                        self.arrays.reclaim(reply);
                    }
                    Err(why) => m.handle_failure(node, tag, why, now, rng),
                },
                Event::Failure { node, tag, why } => m.handle_failure(node, tag, why, now, rng),
                Event::Wake {
                    node,
                    channel,
                    message,
                } => m.handle_wake(
                    node,
                    &data[channel.0..channel.1],
                    &data[message.0..message.1],
                    now,
                    rng,
                ),
                Event::Subscribed => m.handle_subscribed(now, rng),
            }
        }
        c.data.clear();
    }
}
