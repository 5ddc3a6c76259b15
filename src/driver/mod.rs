//! The thin mio driver: it pumps bytes and time for an engine state machine
//! ([`Machine`]), and knows nothing of lock kinds.
//!
//! One persistent connection per node; every transmit to all nodes is written to all N
//! sockets before any reply is read; replies are matched to the transmits' tags in order and
//! fed to the machine as they arrive, with node failures, wake messages (on subscriber
//! connections, opened on the first subscription) and deadlines. What is I/O stays here:
//! connects, the connection setup that gates every command (`conn`), buffers, reconnects with
//! backoff, and the order of commands across runs.
//!
//! A driver is used by one thread at a time; the client keeps a pool of them so that threads
//! run their locks in parallel, each over its own connections.
//!
//! A round is decided at the quorum, while the replies of the other nodes may still be on
//! their way: they are read (and dropped) later, by whichever thread uses the driver next.
//! Redis orders commands only within one connection, so a guard remembers the run that won it
//! as a [`Pending`]; its release and extensions go out on that very driver's connections,
//! behind the run's stragglers, until every reply of the run has been read (see
//! `Client::take_driver`).
#![forbid(unsafe_code)]

mod conn;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Waker};

use crate::config::Config;
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::Caps;
use crate::engine::Round;
use crate::error::NodeErrorKind;
use crate::options::Cancel;
use crate::resp::Reply;
use crate::rng::{Entropy, OsEntropy};
use crate::stats::Recorder;
use conn::{Conn, Role, Slot};

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
/// A driver used by nobody yet: its replies and wake messages are read and dropped.
struct Idle;

impl Machine for Idle {
    type Output = ();

    fn handle_reply(&mut self, _: usize, _: Tag, _: &Reply<'_>, _: Instant, _: &mut dyn Entropy) {}

    fn handle_failure(
        &mut self,
        _: usize,
        _: Tag,
        _: NodeErrorKind,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
    }

    fn handle_timeout(&mut self, _: Instant, _: &mut dyn Entropy) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }

    fn encode(&self, _: &Transmit, _: Caps, _: &mut Vec<u8>) -> usize {
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<()> {
        Some(())
    }
}

/// The run id that no machine gets: replies owed to it belong to nobody.
const NO_RUN: u64 = 0;

pub(crate) struct Driver {
    poll: Poll,
    events: Events,
    ready: Vec<usize>,
    conns: Vec<Conn>,
    /// Subscriber connections, one per node, opened on the first subscription: node `i` has
    /// poll token `n + i`.
    subs: Vec<Conn>,
    /// The confirmations owed for the subscriptions sent on `subs`.
    confirmations: Confirmations,
    config: Arc<Config>,
    /// The id of the last machine run (see [`drive`](Self::drive)).
    run_id: u64,
    /// When the last round of the last run started.
    run_start: Instant,
    /// Shared with the guards of the runs this driver won.
    progress: Arc<Progress>,
    /// A finished round's storage, reused so a round costs no allocation.
    spare: Option<Round>,
    /// Tokens and jitter for the machines this driver runs.
    entropy: OsEntropy,
    /// The client's statistics: the driver times every reply it reads.
    stats: Arc<Recorder>,
    /// The spread of retries after split votes that the last contended acquisition ended with:
    /// contention lasts longer than one acquisition, so the next one starts from it.
    pub spread: Duration,
    /// Wakes this driver's poll when a [`Cancel`] handle is cancelled; made on first use.
    waker: Option<Arc<Waker>>,
}

/// The poll token of the driver's [`Waker`]: no connection has it.
const WAKER: mio::Token = mio::Token(usize::MAX);

impl Driver {
    pub fn new(config: Arc<Config>, stats: Arc<Recorder>) -> io::Result<Driver> {
        let n = config.nodes.len();
        Ok(Driver {
            poll: Poll::new()?,
            events: Events::with_capacity(n.max(4) * 2),
            ready: Vec::with_capacity(n * 2),
            conns: (0..n).map(|i| Conn::new(i, Role::Commands)).collect(),
            subs: Vec::new(),
            confirmations: Confirmations::default(),
            config,
            run_id: NO_RUN,
            run_start: Instant::now(),
            progress: Arc::new(Progress {
                owed_from: AtomicU64::new(u64::MAX),
            }),
            spare: None,
            entropy: OsEntropy::new(),
            spread: Duration::ZERO,
            waker: None,
            stats,
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
            self.wait(deadline - now, &mut Idle, NO_RUN);
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

    /// The last run, for the guard it won: empty when all its replies have been read.
    pub fn pending(&self) -> Pending {
        if self.progress.owed_from.load(Ordering::Relaxed) > self.run_id {
            return Pending::NONE;
        }
        Pending(Some(PendingRound {
            progress: self.progress.clone(),
            round: self.run_id,
            start: self.run_start,
        }))
    }

    /// Whether `pending` is a run of this driver.
    pub fn ran(&self, pending: &Pending) -> bool {
        pending
            .0
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(&p.progress, &self.progress))
    }

    /// Whether replies of some run are still owed on this driver's connections.
    pub fn owes_votes(&self) -> bool {
        self.progress.owed_from.load(Ordering::Relaxed) != u64::MAX
    }

    /// Publishes the oldest run still owed a reply.
    fn publish(&self) {
        let oldest = self.conns.iter().filter_map(Conn::oldest_reply).min();
        self.progress
            .owed_from
            .store(oldest.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Storage for a machine's rounds over this driver's nodes. Give it back with
    /// [`put_round`](Self::put_round) so the next machine reuses it.
    pub fn take_round(&mut self) -> Round {
        match self.spare.take() {
            Some(r) => r,
            None => Round::new(
                self.conns.len(),
                Instant::now(),
                self.config.node_timeout,
                None,
                None,
            ),
        }
    }

    /// Returns a round's storage for reuse.
    pub fn put_round(&mut self, round: Round) {
        self.spare = Some(round);
    }

    /// What the machines this driver runs draw their tokens and jitter from.
    pub fn entropy(&mut self) -> &mut OsEntropy {
        &mut self.entropy
    }

    /// Runs `m` until it has its outcome: sends what it transmits, feeds it every reply, node
    /// failure, wake message and deadline, and returns its outcome.
    ///
    /// Replies owed from earlier runs on the same connections are read and dropped first, in
    /// order, as they arrive. Once `m` is done, commands still held behind a connection's
    /// setup are dropped (they were never sent, and must not go out late, when nobody counts
    /// their replies), and what is queued is flushed, within the node timeout.
    pub fn drive<M: Machine>(&mut self, m: &mut M) -> M::Output {
        self.drive_cancellable(m, None)
    }

    /// Like [`drive`](Self::drive); when `cancel` is cancelled, `m` is told at once
    /// ([`Machine::handle_cancel`]), even while this thread is parked in the poll: the handle
    /// wakes it through this driver's [`Waker`], registered with the handle for the run.
    pub fn drive_cancellable<M: Machine>(
        &mut self,
        m: &mut M,
        cancel: Option<&Cancel>,
    ) -> M::Output {
        self.run_id += 1;
        let id = self.run_id;
        self.confirmations.awaited = false;
        let waker = match cancel {
            Some(_) => self.waker(),
            None => None,
        };
        // Without a waker (the system refused one), the flag is still read at every deadline.
        let registration = cancel.zip(waker).map(|(c, w)| c.register(&w));
        let mut cancelled = false;
        let outcome = loop {
            let now = Instant::now();
            if !cancelled
                && (registration.as_ref().is_some_and(|r| r.is_cancelled())
                    || cancel.is_some_and(Cancel::is_cancelled))
            {
                cancelled = true;
                m.handle_cancel(now, &mut self.entropy);
            }
            self.send(m, id, now);
            if let Some(outcome) = m.poll_outcome() {
                break outcome;
            }
            // A machine that is not done always has a deadline; should one not, it still gets
            // its input.
            let deadline = m
                .poll_timeout()
                .unwrap_or_else(|| now + self.config.node_timeout);
            if now >= deadline {
                m.handle_timeout(now, &mut self.entropy);
                continue;
            }
            self.wait(deadline - now, m, id);
        };
        for c in &mut self.conns {
            if !c.is_ready() && c.owes_run(id) {
                c.drop_held();
            }
        }
        if self.conns.iter().any(Conn::has_pending_output) {
            self.flush_until(Instant::now() + self.config.node_timeout);
        }
        drop(registration);
        self.publish();
        outcome
    }

    /// This driver's waker, made on first use.
    fn waker(&mut self) -> Option<Arc<Waker>> {
        if self.waker.is_none() {
            self.waker = Waker::new(self.poll.registry(), WAKER).ok().map(Arc::new);
        }
        self.waker.clone()
    }

    /// Sends every transmit `m` has.
    fn send<M: Machine>(&mut self, m: &mut M, id: u64, now: Instant) {
        while let Some(t) = m.poll_transmit() {
            match t.to {
                To::All => {
                    if t.tag.is_some() {
                        // A round starts: its replies are what a guard's commands must follow.
                        self.run_start = now;
                    }
                    for i in 0..self.conns.len() {
                        self.send_to(i, &t, m, id, now);
                    }
                }
                To::Node(i) if i < self.conns.len() => self.send_to(i, &t, m, id, now),
                To::Node(_) => {}
                To::Subscribers => self.send_subscribers(&t, m, now),
            }
        }
    }

    /// Sends `t` to node `i`'s command connection. A tagged transmit that cannot be sent is a
    /// failure of that node, at once; an untagged one (a cleanup) goes only where something of
    /// ours can be: to a connection that is up, or still owes replies.
    fn send_to<M: Machine>(&mut self, i: usize, t: &Transmit, m: &mut M, id: u64, now: Instant) {
        let conn = &mut self.conns[i];
        let Some(tag) = t.tag else {
            if !conn.can_send(now) || conn.owed() == 0 && !conn.is_up() {
                // Down, or never got the round's command: nothing of ours can be there.
                return;
            }
            let caps = conn.caps;
            conn.queue(Slot::Discard, |out| m.encode(t, caps, out));
            self.service(i, now, m, id);
            return;
        };
        if !conn.can_send(now) {
            let why = conn.down_reason();
            m.handle_failure(i, tag, why, now, &mut self.entropy);
            return;
        }
        if let Err(why) = conn.prepare(
            self.poll.registry(),
            &self.config.nodes[i],
            now,
            self.config.connect_timeout,
        ) {
            conn.fail(self.poll.registry(), why.clone(), now);
            m.handle_failure(i, tag, why, now, &mut self.entropy);
            return;
        }
        let caps = conn.caps;
        conn.queue(
            Slot::Reply {
                run: id,
                tag,
                sent: now,
            },
            |out| m.encode(t, caps, out),
        );
        // Write now, read later: every node gets its command before any reply is read.
        if let Err(why) = conn.drive(self.poll.registry(), &self.config.limits, false) {
            self.fail(i, why, now, m, id);
        }
    }

    /// Sends `t` on every subscriber connection that can take it, opening them on first use.
    /// A subscription's confirmations are counted, and `m` told when they are all in (at once
    /// when none could be sent, or all came while it was being sent).
    fn send_subscribers<M: Machine>(&mut self, t: &Transmit, m: &mut M, now: Instant) {
        let n = self.conns.len();
        let mut now = now;
        if self.subs.is_empty() {
            self.subs = (0..n).map(|i| Conn::new(n + i, Role::Subscriber)).collect();
            self.confirmations = Confirmations::new(n);
            // A new connection may connect from the instant it was made.
            now = Instant::now();
        }
        // A node may confirm before the next one is written to: those count too.
        self.confirmations.awaited = false;
        let mut sent = false;
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
                self.confirmations.lost(i);
                continue;
            }
            let caps = sub.caps;
            let mut count = 0;
            sub.queue_unmatched(|out| count = m.encode(t, caps, out));
            self.confirmations.sent(i, count);
            sent |= count > 0;
            self.service_subscriber(i, now, m);
        }
        if t.what == What::Subscribe && !self.confirmations.await_sent(sent) {
            m.handle_subscribed(now, &mut self.entropy);
        }
    }

    /// Services I/O until every queued write is on the wire, or `deadline` passes.
    fn flush_until(&mut self, deadline: Instant) {
        while self.conns.iter().any(Conn::has_pending_output) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            self.wait(deadline - now, &mut Idle, NO_RUN);
        }
    }

    /// Waits for readiness at most `timeout`, and services every connection that is ready.
    fn wait<M: Machine>(&mut self, timeout: Duration, m: &mut M, id: u64) {
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                // The poller itself failed; nothing can be read. Sleep out the timeout rather
                // than spin, and let the machine's deadlines decide.
                std::thread::sleep(timeout);
            }
        }
        self.ready.clear();
        let n = self.conns.len();
        for e in self.events.iter() {
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
            self.ready.push(token);
        }
        let now = Instant::now();
        for k in 0..self.ready.len() {
            let token = self.ready[k];
            match token.checked_sub(n) {
                None => self.service(token, now, m, id),
                Some(i) => self.service_subscriber(i, now, m),
            }
        }
    }

    /// Does whatever I/O node `i`'s command connection allows, and hands the replies of run
    /// `id` to `m`.
    fn service<M: Machine>(&mut self, i: usize, now: Instant, m: &mut M, id: u64) {
        let limits = self.config.limits;
        let registry = self.poll.registry();
        let conn = &mut self.conns[i];
        let entropy = &mut self.entropy;
        let stats = &self.stats;
        let mut result = conn.drive(registry, &limits, true).and_then(|()| {
            conn.take_replies(&limits, |slot, reply| {
                if let Slot::Reply { run, tag, sent } = slot {
                    // Every reply is timed, the late ones too: a round decided at the quorum
                    // must not hide the slowest node's latency.
                    stats.reply(i, now.saturating_duration_since(sent));
                    // A straggler of an earlier run: nobody waits for it any more.
                    if run == id {
                        m.handle_reply(i, tag, reply, now, entropy);
                    }
                }
            })
        });
        if result.is_ok() && conn.has_pending_output() {
            // The setup was answered: send what was held behind it.
            result = conn.drive(registry, &limits, false);
        }
        if let Err(why) = result {
            self.fail(i, why, now, m, id);
        }
        self.publish();
    }

    /// Does whatever I/O node `i`'s subscriber connection allows: confirmations are counted,
    /// messages handed to `m`.
    fn service_subscriber<M: Machine>(&mut self, i: usize, now: Instant, m: &mut M) {
        let limits = self.config.limits;
        let registry = self.poll.registry();
        let Some(sub) = self.subs.get_mut(i) else {
            return;
        };
        let entropy = &mut self.entropy;
        let confirmations = &mut self.confirmations;
        let mut result = sub.drive(registry, &limits, true).and_then(|()| {
            sub.take_replies(&limits, |_, reply| {
                let Reply::Array(Some(items)) = reply else {
                    return;
                };
                match (items.first(), items.get(1), items.get(2)) {
                    (
                        Some(Reply::Bulk(Some(b"message"))),
                        Some(Reply::Bulk(Some(channel))),
                        message,
                    ) => {
                        let message = match message {
                            Some(Reply::Bulk(Some(m))) => *m,
                            _ => &[],
                        };
                        m.handle_wake(i, channel, message, now, entropy);
                    }
                    (Some(Reply::Bulk(Some(b"subscribe"))), _, _) if confirmations.confirmed(i) => {
                        m.handle_subscribed(now, entropy);
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
            // A lost subscriber only costs wake-ups: the retry delay is the backstop. Its
            // confirmations will not come.
            sub.fail(registry, why, now);
            if self.confirmations.lost(i) {
                m.handle_subscribed(now, &mut self.entropy);
            }
        }
    }

    /// Closes node `i`'s connection and tells `m` of every reply of run `id` it still owed.
    fn fail<M: Machine>(&mut self, i: usize, why: NodeErrorKind, now: Instant, m: &mut M, id: u64) {
        let owed = self.conns[i].fail(self.poll.registry(), why.clone(), now);
        self.publish();
        for slot in owed {
            if let Slot::Reply { run, tag, .. } = slot {
                if run == id {
                    m.handle_failure(i, tag, why.clone(), now, &mut self.entropy);
                }
            }
        }
    }
}

/// The confirmations owed for the subscriptions sent on the subscriber connections, one count
/// per connection. A connection confirms in order, so a late confirmation of an earlier
/// subscription counts for that one, and confirmations read while a subscription is still
/// being sent to the other nodes count for it.
#[derive(Debug, Default)]
struct Confirmations {
    /// Per subscriber connection, the confirmations still owed.
    owed: Vec<usize>,
    /// The machine of this run waits for the subscription sent last.
    awaited: bool,
}

impl Confirmations {
    /// Nothing owed on `n` connections.
    fn new(n: usize) -> Confirmations {
        Confirmations {
            owed: vec![0; n],
            awaited: false,
        }
    }

    /// Connection `i` was sent a subscription that it confirms `count` times.
    fn sent(&mut self, i: usize, count: usize) {
        if let Some(owed) = self.owed.get_mut(i) {
            *owed += count;
        }
    }

    /// The subscription is sent (`sent`: to at least one connection). Returns whether its
    /// confirmations are still to come; if so, [`confirmed`](Self::confirmed) or
    /// [`lost`](Self::lost) says when they are all in.
    fn await_sent(&mut self, sent: bool) -> bool {
        self.awaited = sent && self.owed.iter().any(|&c| c > 0);
        self.awaited
    }

    /// Connection `i` confirmed a subscription. Returns whether the awaited one is now
    /// confirmed everywhere.
    fn confirmed(&mut self, i: usize) -> bool {
        if let Some(owed) = self.owed.get_mut(i) {
            *owed = owed.saturating_sub(1);
        }
        self.settle()
    }

    /// Connection `i` failed: what it owed will not come. Returns whether the awaited
    /// subscription is now confirmed on every other connection.
    fn lost(&mut self, i: usize) -> bool {
        if let Some(owed) = self.owed.get_mut(i) {
            *owed = 0;
        }
        self.settle()
    }

    fn settle(&mut self) -> bool {
        let done = self.awaited && self.owed.iter().all(|&c| c == 0);
        if done {
            self.awaited = false;
        }
        done
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Nothing more will be read here: nobody should wait for it.
        self.progress.owed_from.store(u64::MAX, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::Confirmations;

    /// Sends one subscription of `channels` channels to `nodes` nodes, with the confirmations
    /// read between the sends (`early[i]` for node `i`, as the driver reads right after writing
    /// to a node); returns whether the machine is told it is subscribed, and when: `Some(0)` at
    /// the end of the sends, `Some(k)` at the k-th confirmation read afterwards.
    fn subscribe(
        c: &mut Confirmations,
        nodes: usize,
        channels: usize,
        early: &[usize],
    ) -> Option<usize> {
        let mut told = None;
        for i in 0..nodes {
            c.sent(i, channels);
            for _ in 0..early.get(i).copied().unwrap_or(0) {
                assert!(!c.confirmed(i), "told before the subscription was sent");
            }
        }
        if !c.await_sent(true) {
            return Some(0);
        }
        let mut k = 0;
        for i in 0..nodes {
            let late = channels - early.get(i).copied().unwrap_or(0);
            for _ in 0..late {
                k += 1;
                if c.confirmed(i) {
                    assert!(told.is_none(), "told twice");
                    told = Some(k);
                }
            }
        }
        told
    }

    /// A node that confirms before the subscription is written to the next node: its
    /// confirmation counts. These were lost, and the waiter sat out the node timeout before
    /// its next attempt.
    #[test]
    fn a_confirmation_read_while_sending_counts() {
        let mut c = Confirmations::new(5);
        assert_eq!(subscribe(&mut c, 5, 1, &[1, 0, 1]), Some(3));
        // Every node confirmed while it was being sent: subscribed at once.
        assert_eq!(subscribe(&mut c, 5, 1, &[1, 1, 1, 1, 1]), Some(0));
        // Several channels per node.
        assert_eq!(subscribe(&mut c, 5, 2, &[2, 1]), Some(7));
    }

    /// A confirmation of an earlier subscription, read late on a reused connection, counts for
    /// that one, not for the next.
    #[test]
    fn a_late_confirmation_counts_for_its_own_subscription() {
        let mut c = Confirmations::new(3);
        for i in 0..3 {
            c.sent(i, 1);
        }
        assert!(c.await_sent(true));
        // The machine went on without it (the confirmation deadline passed), and the next
        // acquisition on this driver subscribes again.
        c.awaited = false;
        for i in 0..3 {
            c.sent(i, 1);
        }
        assert!(c.await_sent(true));
        // The first subscription's confirmations, then the second's.
        for i in 0..3 {
            assert!(!c.confirmed(i));
        }
        assert!(!c.confirmed(0));
        assert!(!c.confirmed(1));
        assert!(c.confirmed(2));
    }

    /// A failed subscriber connection owes nothing: the others' confirmations suffice.
    #[test]
    fn a_failed_connection_owes_nothing() {
        let mut c = Confirmations::new(3);
        for i in 0..3 {
            c.sent(i, 1);
        }
        assert!(c.await_sent(true));
        assert!(!c.confirmed(0));
        assert!(!c.confirmed(2));
        assert!(c.lost(1));
        // Nothing sent anywhere: nothing to wait for.
        assert!(!c.await_sent(false));
    }
}
