//! The thin mio driver: one persistent connection per node, every command written to all N
//! sockets before any reply is read, replies fed to the sans-IO [`Round`] as they arrive.
//!
//! A driver is used by one thread at a time; the client keeps a pool of them so that threads
//! run their rounds in parallel, each over its own connections.
//!
//! A round is decided at the quorum, while the votes of the other nodes may still be on their
//! way: they are read (and dropped) later, by whichever thread uses the driver next. Redis
//! orders commands only within one connection, so a guard remembers the round that won it as
//! a [`Pending`]; its release and extensions go out on that very driver's connections, behind
//! the round's stragglers, until every vote of the round has been read (see
//! `Client::take_driver`).
#![forbid(unsafe_code)]

mod conn;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

use crate::config::Config;
use crate::engine::ops::{Op, ScriptForm, Verdict};
use crate::engine::{Round, Vote};
use crate::error::NodeErrorKind;
use crate::rng::Jitter;

use crate::engine::keys;
use crate::resp::{self, Reply};
use conn::{Conn, Role, Slot};

/// How close together the nodes' announcements of one release arrive, at the most, for
/// them to count as one.
const WAKE_EVENT: Duration = Duration::from_millis(1);

/// What a driver tells the guards of the rounds it ran: the oldest round whose votes it still
/// owes, `u64::MAX` when it owes none. Updated as replies are read, connections fail and held
/// commands are dropped.
#[derive(Debug)]
struct Progress {
    owed_from: AtomicU64,
}

/// The round that won a guard's lock, while some of its votes may still be in flight: the
/// guard's release or extension must not overtake them. Empty once they have all been read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pending(Option<PendingRound>);

#[derive(Debug, Clone)]
struct PendingRound {
    /// The driver that ran the round.
    progress: Arc<Progress>,
    round: u64,
    start: Instant,
}

impl Pending {
    /// Nothing in flight: any driver will do.
    pub const NONE: Pending = Pending(None);

    /// True when every vote of the round has been read, or lost with its connection (or the
    /// driver is gone): commands sent now, on any connection, come after them.
    pub fn settled(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|p| p.progress.owed_from.load(Ordering::Acquire) > p.round)
    }

    /// When the round started, unless it is settled.
    pub fn unsettled_since(&self) -> Option<Instant> {
        self.0.as_ref().filter(|_| !self.settled()).map(|p| p.start)
    }
}
/// How many characters of a released token its announcement carries (see
/// [`WAKE_PREFIX`](crate::engine::keys::WAKE_PREFIX)).
const WAKE_ID_LEN: usize = 16;

/// The round in progress, as the reply handler needs it.
struct Current<'a> {
    id: u64,
    op: &'a dyn Op,
    round: &'a mut Round,
}

pub(crate) struct Driver {
    poll: Poll,
    events: Events,
    ready: Vec<usize>,
    conns: Vec<Conn>,
    /// Subscriber connections, one per node, opened on the first wait: node `i` has poll token
    /// `n + i`.
    subs: Vec<Conn>,
    /// Subscriptions confirmed since the last [`subscribe`](Self::subscribe).
    confirmed: usize,
    /// A message arrived on a wake channel since the last subscribe or retry.
    woken: bool,
    /// The last release announced, and when: each node announces it, and it counts once.
    last_wake: Vec<u8>,
    last_wake_at: Option<Instant>,
    /// The nodes (bit `i` for node `i`) whose announcements wake this waiter: those that did
    /// not grant its last attempt. See [`wake_after`](Self::wake_after).
    wake_nodes: u64,
    /// What the cleanups of this waiter's last two attempts announce (the first characters of
    /// their tokens): its own lost attempts are no reason to retry.
    own_wakes: [[u8; WAKE_ID_LEN]; 2],
    config: Arc<Config>,
    round_id: u64,
    /// When the last round started.
    round_start: Instant,
    /// Shared with the guards of the rounds this driver won.
    progress: Arc<Progress>,
    /// A finished round's storage, reused so a round costs no allocation.
    spare: Option<Round>,
    /// Set when a node answered the current round with NOSCRIPT.
    noscript: bool,
    /// Retry jitter for the thread using this driver.
    pub jitter: Jitter,
    /// The spread of retries after split votes that the last contended acquisition ended with:
    /// contention lasts longer than one acquisition, so the next one starts from it.
    pub spread: Duration,
}

impl Driver {
    pub fn new(config: Arc<Config>) -> io::Result<Driver> {
        let n = config.nodes.len();
        Ok(Driver {
            poll: Poll::new()?,
            events: Events::with_capacity(n.max(4) * 2),
            ready: Vec::with_capacity(n * 2),
            conns: (0..n).map(|i| Conn::new(i, Role::Commands)).collect(),
            subs: Vec::new(),
            confirmed: 0,
            woken: false,
            last_wake: Vec::with_capacity(16),
            last_wake_at: None,
            wake_nodes: u64::MAX,
            own_wakes: [[0; WAKE_ID_LEN]; 2],
            config,
            round_id: 0,
            round_start: Instant::now(),
            progress: Arc::new(Progress {
                owed_from: AtomicU64::new(u64::MAX),
            }),
            spare: None,
            noscript: false,
            jitter: Jitter::from_os(),
            spread: Duration::ZERO,
        })
    }

    /// Opens every connection that is due and waits, until `deadline` at the most, for each to
    /// be set up (or to fail), so the first rounds do not spend their per-node timeout on TCP
    /// and setup. Nodes that are down only count against the quorum later; nodes whose setup
    /// was refused are listed by [`setup_failures`](Self::setup_failures).
    pub fn warm_up(&mut self, deadline: Instant) {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if !self.conns[i].can_send(now) {
                continue;
            }
            if let Err(why) = self.conns[i].prepare(
                self.poll.registry(),
                &self.config.nodes[i],
                now,
                self.config.connect_timeout,
            ) {
                self.conns[i].fail(self.poll.registry(), why, now);
            }
        }
        // Nothing reconnects here: a connection that went down has had its one try.
        let settled = |c: &Conn| c.is_down() || (c.is_ready() && c.owed() == 0);
        while !self.conns.iter().all(settled) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            self.wait(deadline - now, &mut None);
        }
    }

    /// The nodes whose last connection was closed because its setup was refused (see
    /// [`NodeErrorKind::Setup`]), with the reason.
    pub fn setup_failures(&self) -> Vec<(usize, NodeErrorKind)> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, c.setup_error()?.clone())))
            .collect()
    }

    /// The last round run, for the guard it won: empty when all its votes have been read.
    pub fn pending(&self) -> Pending {
        if self.progress.owed_from.load(Ordering::Relaxed) > self.round_id {
            return Pending::NONE;
        }
        Pending(Some(PendingRound {
            progress: self.progress.clone(),
            round: self.round_id,
            start: self.round_start,
        }))
    }

    /// Whether `pending` is a round of this driver.
    pub fn ran(&self, pending: &Pending) -> bool {
        pending
            .0
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(&p.progress, &self.progress))
    }

    /// Whether votes of some round are still owed on this driver's connections.
    pub fn owes_votes(&self) -> bool {
        self.progress.owed_from.load(Ordering::Relaxed) != u64::MAX
    }

    /// Publishes the oldest round still owed a vote.
    fn publish(&self) {
        let oldest = self.conns.iter().filter_map(Conn::oldest_vote).min();
        self.progress
            .owed_from
            .store(oldest.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// A round over this driver's nodes, started at `start` (see [`Round::new`]). Give it back
    /// with [`put_round`](Self::put_round) so the next one reuses its storage.
    pub fn take_round(
        &mut self,
        start: Instant,
        timing: Option<crate::engine::Timing>,
        hold_until: Option<Instant>,
    ) -> Round {
        let node_timeout = self.config.node_timeout;
        match self.spare.take() {
            Some(mut r) => {
                r.reset(start, node_timeout, timing, hold_until);
                r
            }
            None => Round::new(self.conns.len(), start, node_timeout, timing, hold_until),
        }
    }

    /// Returns a round's storage for reuse.
    pub fn put_round(&mut self, round: Round) {
        self.spare = Some(round);
    }

    /// Sends `op` to every node and feeds the replies to `round` until it is decided.
    ///
    /// `round` must have been started (with the instant before this call) over as many nodes as
    /// the client has. Replies owed from earlier rounds on the same connections are read and
    /// dropped first, in order, as they arrive.
    pub fn run(&mut self, op: &dyn Op, round: &mut Round) {
        self.round_id += 1;
        self.round_start = round.start();
        let id = self.round_id;
        let stragglers_until = round.start() + self.config.node_timeout;
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if !self.conns[i].can_send(now) {
                let why = self.conns[i].down_reason();
                round.handle_vote(i, Vote::Failed(why), now);
                continue;
            }
            if let Err(why) = self.conns[i].prepare(
                self.poll.registry(),
                &self.config.nodes[i],
                now,
                self.config.connect_timeout,
            ) {
                self.conns[i].fail(self.poll.registry(), why.clone(), now);
                round.handle_vote(i, Vote::Failed(why), now);
                continue;
            }
            let caps = self.conns[i].caps;
            self.conns[i].queue(
                Slot::Vote {
                    round: id,
                    form: ScriptForm::Sha,
                },
                |out| op.encode_for(out, ScriptForm::Sha, caps),
            );
            // Write now, read later: every node gets its command before any reply is read.
            if let Err(why) = self.conns[i].drive(self.poll.registry(), &self.config.limits, false)
            {
                self.fail(i, why, now, &mut Some(Current { id, op, round }));
            }
        }
        let mut current = Some(Current { id, op, round });
        while let Some(deadline) = current.as_ref().and_then(|c| c.round.poll_timeout()) {
            let now = Instant::now();
            if now >= deadline {
                if let Some(c) = current.as_mut() {
                    c.round.handle_timeout(now);
                }
                continue;
            }
            self.wait(deadline - now, &mut current);
        }
        if std::mem::take(&mut self.noscript) {
            // The script cache was flushed: the nodes outside the quorum will most likely
            // answer NOSCRIPT too. Keep serving this round (within the node timeout) so their
            // EVAL goes out now, not on this connection's next use, which may come after the
            // TTL. Their votes no longer change the decision.
            while self.conns.iter().any(|c| c.owes_round(id)) {
                let now = Instant::now();
                if now >= stragglers_until {
                    break;
                }
                self.wait(stragglers_until - now, &mut current);
            }
        }
        // A command still held behind a connection's setup was never sent: it must not go out
        // late, when nobody counts its vote any more (an acquisition would leave a lock behind).
        for c in &mut self.conns {
            if !c.is_ready() && c.owes_round(id) {
                c.drop_held();
            }
        }
        self.publish();
    }

    /// Queues `op` on every node that can take it, replies discarded: the cleanup after a lost
    /// round. It is pipelined behind the round's own command, so a node that answers that
    /// command late is cleaned up too. Scripts go with their body so no reply needs reading.
    pub fn broadcast(&mut self, op: &dyn Op) {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if !self.conns[i].can_send(now) || self.conns[i].owed() == 0 && !self.conns[i].is_up() {
                // Down, or never got the round's command: nothing of ours can be there.
                continue;
            }
            let caps = self.conns[i].caps;
            self.conns[i].queue(Slot::Discard, |out| {
                op.encode_for(out, ScriptForm::Body, caps)
            });
            self.service(i, now, &mut None);
        }
    }

    /// Subscribes to the wake channels of `resources` on every node, and waits (at most the
    /// per-node timeout) until the nodes confirm, so that any release from then on is heard.
    pub fn subscribe(&mut self, resources: &[&[u8]]) {
        let n = self.conns.len();
        if self.subs.is_empty() {
            self.subs = (0..n).map(|i| Conn::new(n + i, Role::Subscriber)).collect();
        }
        self.woken = false;
        self.last_wake.clear();
        self.confirmed = 0;
        let now = Instant::now();
        let mut expected = 0;
        for i in 0..n {
            let sub = &mut self.subs[i];
            if !sub.can_send(now) {
                continue;
            }
            if let Err(why) = sub.prepare(
                self.poll.registry(),
                &self.config.nodes[i],
                now,
                self.config.connect_timeout,
            ) {
                sub.fail(self.poll.registry(), why, now);
                continue;
            }
            sub.queue_unmatched(|out| write_channels(out, b"SUBSCRIBE", resources));
            // One confirmation per channel.
            expected += resources.len();
            self.service(n + i, now, &mut None);
        }
        let deadline = now + self.config.node_timeout;
        while self.confirmed < expected {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.wait(deadline - now, &mut None);
        }
    }

    /// Leaves the wake channels of `resources`; nothing is waited for.
    pub fn unsubscribe(&mut self, resources: &[&[u8]]) {
        let now = Instant::now();
        let n = self.conns.len();
        for i in 0..self.subs.len() {
            if self.subs[i].is_up() {
                self.subs[i].queue_unmatched(|out| write_channels(out, b"UNSUBSCRIBE", resources));
                self.service(n + i, now, &mut None);
            }
        }
    }

    /// Forgets wake messages seen so far: call right before an attempt, so that only releases
    /// after it cut the next wait short.
    pub fn clear_wake(&mut self) {
        self.woken = false;
    }

    /// Narrows what wakes this waiter to what can help its next attempt, after an attempt with
    /// `token` that was decided with `votes` (as [`Round::votes`]): announcements from the nodes
    /// that refused it or failed, and not those of its own cleanup. A node that granted the
    /// attempt, or had not answered yet, is not waited for; the other waiters' lost attempts
    /// announce their cleanups there, and waking for those would make the losers of a split
    /// vote wake each other for as long as the winner holds the lock.
    pub fn wake_after(&mut self, votes: &[Option<Vote>], token: &[u8]) {
        self.wake_nodes = votes
            .iter()
            .enumerate()
            .filter(|(_, v)| matches!(v, Some(Vote::No | Vote::Failed(_))))
            .fold(0, |mask, (i, _)| mask | 1 << i);
        let mut id = [0; WAKE_ID_LEN];
        let n = token.len().min(WAKE_ID_LEN);
        id[..n].copy_from_slice(&token[..n]);
        if self.own_wakes[0] != id {
            self.own_wakes = [id, self.own_wakes[0]];
        }
    }

    /// Services I/O (draining late replies, finishing writes) until `until`.
    pub fn sleep_until(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            self.wait(until - now, &mut None);
        }
    }

    /// Services I/O (draining late replies, finishing writes) until `until`, or until a release
    /// is announced on a subscribed wake channel. Returns whether a release was announced.
    pub fn wait_wake(&mut self, until: Instant) -> bool {
        loop {
            if self.woken {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            self.wait(until - now, &mut None);
        }
    }

    /// Services I/O until every queued write is on the wire, or `deadline` passes.
    pub fn flush_until(&mut self, deadline: Instant) {
        while self.conns.iter().any(Conn::has_pending_output) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            self.wait(deadline - now, &mut None);
        }
    }

    /// Waits for readiness at most `timeout`, and services every connection that is ready.
    fn wait(&mut self, timeout: Duration, current: &mut Option<Current<'_>>) {
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                // The poller itself failed; nothing can be read. Sleep out the timeout rather
                // than spin, and let the round's deadlines decide.
                std::thread::sleep(timeout);
            }
        }
        self.ready.clear();
        let n = self.conns.len();
        for e in self.events.iter() {
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
            self.ready.push(token);
        }
        let now = Instant::now();
        for k in 0..self.ready.len() {
            self.service(self.ready[k], now, current);
        }
        if let Some(c) = current.as_mut() {
            c.round.handle_timeout(now);
        }
    }

    /// Does whatever I/O the connection with poll token `token` allows: a command connection
    /// hands complete replies to the round, a subscriber connection notes wake messages.
    fn service(&mut self, token: usize, now: Instant, current: &mut Option<Current<'_>>) {
        let n = self.conns.len();
        if token >= n {
            self.service_subscriber(token - n, now);
            return;
        }
        let i = token;
        let limits = self.config.limits;
        let registry = self.poll.registry();
        let conn = &mut self.conns[i];
        let noscript = &mut self.noscript;
        let mut result = conn.drive(registry, &limits, true);
        // A NOSCRIPT queues a resend; the `drive` that sends it may also read more replies,
        // which must be decoded now: with edge-triggered readiness no event will come for
        // bytes already read. Each pass needs an `EVALSHA` slot answered NOSCRIPT, so this ends.
        while result.is_ok() {
            let mut resent = false;
            result = conn.take_replies(&limits, |slot, reply, out, owed| {
                let Slot::Vote { round: id, form } = slot else {
                    return;
                };
                let Some(c) = current.as_mut().filter(|c| c.id == id) else {
                    // A straggler of an earlier round: nobody waits for it any more.
                    return;
                };
                match c.op.classify(reply) {
                    Verdict::Vote(v) => c.round.handle_vote(i, v, now),
                    Verdict::NoScript if form == ScriptForm::Sha => {
                        *noscript = true;
                        c.op.encode(out, ScriptForm::Body);
                        owed.push_back(Slot::Vote {
                            round: id,
                            form: ScriptForm::Body,
                        });
                        resent = true;
                    }
                    Verdict::NoScript => {
                        c.round
                            .handle_vote(i, Vote::Failed(NodeErrorKind::UnexpectedReply), now)
                    }
                }
            });
            if result.is_err() || !resent {
                break;
            }
            result = conn.drive(registry, &limits, true);
        }
        if result.is_ok() && conn.has_pending_output() {
            // The setup was answered: send what was held behind it.
            result = conn.drive(registry, &limits, false);
        }
        if let Err(why) = result {
            self.fail(i, why, now, current);
        }
        self.publish();
    }

    fn service_subscriber(&mut self, i: usize, now: Instant) {
        let limits = self.config.limits;
        let registry = self.poll.registry();
        let Some(sub) = self.subs.get_mut(i) else {
            return;
        };
        let (woken, confirmed) = (&mut self.woken, &mut self.confirmed);
        let (last, last_at) = (&mut self.last_wake, &mut self.last_wake_at);
        let own = &self.own_wakes;
        let from_refusing_node = i < 64 && self.wake_nodes & 1 << i != 0;
        let mut result = sub.drive(registry, &limits, true).and_then(|()| {
            sub.take_replies(&limits, |_, reply, _, _| {
                if let Reply::Array(Some(items)) = reply {
                    match items.first() {
                        Some(Reply::Bulk(Some(b"message"))) => {
                            let id = match items.get(2) {
                                Some(Reply::Bulk(Some(id))) => *id,
                                _ => &[],
                            };
                            if !from_refusing_node || own.iter().any(|o| o[..] == *id) {
                                return;
                            }
                            // The nodes announce one release within moments of each other. The
                            // same name later is another event: a token is announced by the
                            // cleanup of a lost attempt, and again by its release.
                            let same_event = id == last.as_slice()
                                && last_at
                                    .is_some_and(|t| now.saturating_duration_since(t) < WAKE_EVENT);
                            if id.is_empty() || !same_event {
                                last.clear();
                                last.extend_from_slice(id);
                                *last_at = Some(now);
                                *woken = true;
                            }
                        }
                        Some(Reply::Bulk(Some(b"subscribe"))) => *confirmed += 1,
                        _ => {}
                    }
                }
            })
        });
        if result.is_ok() && sub.has_pending_output() {
            // The setup was answered: send the subscriptions held behind it.
            result = sub.drive(registry, &limits, false);
        }
        if let Err(why) = result {
            // A lost subscriber only costs wake-ups: the retry delay is the backstop.
            sub.fail(registry, why, now);
        }
    }

    /// Closes node `i`'s connection and fails the current round's vote on it, if still owed.
    fn fail(
        &mut self,
        i: usize,
        why: NodeErrorKind,
        now: Instant,
        current: &mut Option<Current<'_>>,
    ) {
        let owed = self.conns[i].fail(self.poll.registry(), why.clone(), now);
        self.publish();
        if let Some(c) = current.as_mut() {
            if owed
                .iter()
                .any(|s| matches!(s, Slot::Vote { round, .. } if *round == c.id))
            {
                c.round.handle_vote(i, Vote::Failed(why), now);
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Nothing more will be read here: nobody should wait for it.
        self.progress.owed_from.store(u64::MAX, Ordering::Release);
    }
}

/// Writes `command` (SUBSCRIBE or UNSUBSCRIBE) with the wake channel of every resource.
fn write_channels(out: &mut Vec<u8>, command: &[u8], resources: &[&[u8]]) {
    resp::write_array_len(out, 1 + resources.len());
    resp::write_bulk(out, command);
    for resource in resources {
        keys::wake_channel(resource).write_bulk(out);
    }
}
