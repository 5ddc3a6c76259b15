//! Wake channels: which callers listen to which channel, the subscriptions each node's pub/sub
//! connection owes a confirmation for, and the delivery of release announcements.
//!
//! Subscriptions are counted per channel: the first caller of a channel subscribes every pub/sub
//! connection to it, the last one unsubscribes them. A published message goes to the callers
//! of its channel only. A caller is told it is subscribed once every confirmation owed for its
//! channels on every node has come (or that node's pub/sub connection failed).
//!
//! A channel has two names: the one standalone members announce on (`PUBLISH`, `SUBSCRIBE`),
//! and the one in the lock's hash slot that Redis Cluster members announce on (`SPUBLISH`,
//! `SSUBSCRIBE`; see `keys::wake_channel_for`). On a cluster member, a channel is subscribed
//! to on the pub/sub connection of one link only, the master that owns its slot, and moves
//! with the slot: the endpoint follows a `-MOVED` answer to `SSUBSCRIBE` and the
//! `sunsubscribe` a master pushes when the slot leaves it.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::cluster;
use super::mail::{Event, Mail};
use super::{CallerId, ConnId, Endpoint, Io};
use crate::engine::machine::{Machine, Transmit};
use crate::engine::ops::Caps;
use crate::resp::{self, Limits, Reply, Status};
use crate::url::Target;

/// A wake channel the pub/sub connections are (being) subscribed to.
#[derive(Debug)]
struct Channel {
    /// The name standalone members announce on.
    name: Vec<u8>,
    /// The name cluster members announce on, in the lock's slot.
    sharded: Vec<u8>,
    /// The hash slot of `sharded`.
    slot: u16,
    /// Callers holding it; unsubscribed when this drops to zero.
    refs: usize,
    /// The callers (caller, run) to wake on a message.
    waiters: Vec<(CallerId, u64)>,
    /// Per node, confirmations owed for the SUBSCRIBE (SSUBSCRIBE) commands sent.
    owed: Vec<u32>,
    /// Per node, the callers waiting for those confirmations.
    awaiting: Vec<Vec<(CallerId, u64)>>,
    /// Per node, the `SUNSUBSCRIBE` commands sent whose confirmation has not come: a
    /// `sunsubscribe` beyond those is the server's, for a slot that left it.
    leaving: Vec<u32>,
    /// Per quorum member that is a cluster: the link subscribed (or subscribing) to it.
    on: Vec<Option<usize>>,
}

/// What a message on a pub/sub connection asks of the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Push {
    /// Nothing.
    Nothing,
    /// The master pushed `sunsubscribe` for channel `idx`, which callers still hold: its slot
    /// left that master, and the channel is to be subscribed to at the slot's new owner.
    Dropped(usize),
    /// An error answered a subscription (`-MOVED`, `-ASK`, `-CLUSTERDOWN`…): its bytes.
    Error(Vec<u8>),
}

#[derive(Debug)]
pub(crate) struct Channels {
    /// How many nodes a channel counts confirmations for (members and links).
    nodes: usize,
    /// How many quorum members.
    members: usize,
    channels: Vec<Channel>,
    /// Where a machine's subscription is written before it is read back for its channels.
    scratch: Vec<u8>,
    /// The channels the last [`add`](Channels::add) took from no caller to one, or the last
    /// [`remove`](Channels::remove) from one to none.
    pub changed: Vec<usize>,
}

/// The channel names of the subscription written in `bytes`.
fn names<'a>(bytes: &'a [u8], limits: &Limits) -> Vec<&'a [u8]> {
    let mut rest = bytes;
    let mut out = Vec::new();
    while let Ok(Status::Complete((Reply::Array(Some(items)), used))) = resp::decode(rest, limits) {
        rest = &rest[used..];
        for item in items.iter().skip(1) {
            if let Reply::Bulk(Some(name)) = item {
                out.push(*name);
            }
        }
    }
    out
}

impl Channels {
    /// Channels for `members` quorum members and `nodes` nodes in all (links included).
    pub fn new(members: usize, nodes: usize) -> Channels {
        Channels {
            nodes,
            members,
            channels: Vec::new(),
            scratch: Vec::new(),
            changed: Vec::new(),
        }
    }

    /// There are `nodes` nodes now (links were added): every channel counts confirmations
    /// for them too.
    pub fn grow(&mut self, nodes: usize) {
        if nodes <= self.nodes {
            return;
        }
        self.nodes = nodes;
        for ch in &mut self.channels {
            ch.owed.resize(nodes, 0);
            ch.awaiting.resize_with(nodes, Vec::new);
            ch.leaving.resize(nodes, 0);
        }
    }

    /// Adds the caller to the channels `m` subscribes to with `t`. The channels nobody held
    /// before are left in [`changed`](Self::changed): they are to be subscribed to on every
    /// member.
    pub fn add<M: Machine>(
        &mut self,
        t: &Transmit,
        m: &mut M,
        caller: CallerId,
        run: u64,
        limits: &Limits,
        mail: &mut Mail,
    ) {
        self.changed.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        m.encode(t, Caps::default(), &mut scratch);
        let plain_end = scratch.len();
        let sharded = Caps {
            sharded: true,
            ..Caps::default()
        };
        m.encode(t, sharded, &mut scratch);
        let (plain, sharded) = scratch.split_at(plain_end);
        let plain = names(plain, limits);
        let sharded = names(sharded, limits);
        for (k, name) in plain.iter().enumerate() {
            let sname = sharded.get(k).copied().unwrap_or(name);
            let idx = self.index_of(name, sname);
            let c = mail.caller(caller);
            if c.chans.contains(&idx) {
                continue;
            }
            c.chans.push(idx);
            let ch = &mut self.channels[idx];
            ch.refs += 1;
            ch.waiters.push((caller, run));
            if ch.refs == 1 {
                self.changed.push(idx);
            }
        }
        self.scratch = scratch;
    }

    /// The channel named `name` (`sharded` on cluster members), made (or a slot nobody uses
    /// reused) if there is none.
    fn index_of(&mut self, name: &[u8], sharded: &[u8]) -> usize {
        if let Some(idx) = self.channels.iter().position(|c| c.name == name) {
            return idx;
        }
        let fresh = Channel {
            name: name.to_vec(),
            sharded: sharded.to_vec(),
            slot: cluster::key_slot(sharded),
            refs: 0,
            waiters: Vec::new(),
            owed: vec![0; self.nodes],
            awaiting: (0..self.nodes).map(|_| Vec::new()).collect(),
            leaving: vec![0; self.nodes],
            on: vec![None; self.members],
        };
        let unused = |c: &Channel| {
            c.refs == 0
                && c.owed.iter().all(|&o| o == 0)
                && c.leaving.iter().all(|&o| o == 0)
                && c.on.iter().all(Option::is_none)
        };
        match self.channels.iter().position(unused) {
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

    /// Whether node `node`'s pub/sub connection has a channel on it for `member`, or owes a
    /// confirmation of a subscription or unsubscription.
    pub fn uses(&self, node: usize, member: usize) -> bool {
        self.channels.iter().any(|c| {
            c.on.get(member) == Some(&Some(node))
                || c.owed.get(node).is_some_and(|&o| o > 0)
                || c.leaving.get(node).is_some_and(|&o| o > 0)
        })
    }

    /// The hash slot of channel `idx` on cluster members.
    pub fn slot(&self, idx: usize) -> u16 {
        self.channels[idx].slot
    }

    /// Whether callers hold channel `idx`.
    pub fn held(&self, idx: usize) -> bool {
        self.channels[idx].refs > 0
    }

    /// How many channels there are (held or not).
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// The link of cluster member `member` subscribed to channel `idx`, if any.
    pub fn on(&self, idx: usize, member: usize) -> Option<usize> {
        self.channels[idx].on[member]
    }

    /// Channel `idx` is subscribed to on `link` for cluster member `member` (`None`: on none).
    pub fn set_on(&mut self, idx: usize, member: usize, link: Option<usize>) {
        self.channels[idx].on[member] = link;
    }

    /// After [`add`](Self::add) and the subscriptions it called for: the caller waits for
    /// every confirmation still owed for its channels, or is told at once that it is
    /// subscribed.
    pub fn await_confirmations(&mut self, caller: CallerId, run: u64, mail: &mut Mail) {
        let mut awaiting = 0;
        for k in 0..mail.caller(caller).chans.len() {
            let idx = mail.caller(caller).chans[k];
            let ch = &mut self.channels[idx];
            for i in 0..self.nodes {
                if ch.owed[i] > 0 && !ch.awaiting[i].contains(&(caller, run)) {
                    ch.awaiting[i].push((caller, run));
                    awaiting += 1;
                }
            }
        }
        let c = mail.caller(caller);
        c.awaiting += awaiting;
        if c.awaiting == 0 {
            c.await_subscribed = false;
            mail.post(caller, run, Event::Subscribed);
        } else {
            c.await_subscribed = true;
        }
    }

    /// Writes, with `queue`, the subscriptions node `node`'s pub/sub connection needs: channel
    /// `idx`, or on a fresh connection every channel somebody holds there. On a link of
    /// cluster member `sharded` those are `SSUBSCRIBE`s, of the channels subscribed on it.
    pub fn write_subscribe(
        &mut self,
        node: usize,
        idx: Option<usize>,
        fresh: bool,
        sharded: Option<usize>,
        mut queue: impl FnMut(&mut dyn FnMut(&mut Vec<u8>)),
    ) {
        for (k, ch) in self.channels.iter_mut().enumerate() {
            let here = sharded.is_none_or(|m| ch.on[m] == Some(node));
            let wanted = if fresh {
                ch.refs > 0 && here
            } else {
                Some(k) == idx
            };
            if !wanted {
                continue;
            }
            match sharded {
                None => queue(&mut |out| resp::encode_command(out, &[b"SUBSCRIBE", &ch.name])),
                Some(_) => {
                    queue(&mut |out| resp::encode_command(out, &[b"SSUBSCRIBE", &ch.sharded]))
                }
            }
            ch.owed[node] += 1;
        }
    }

    /// Writes, with `queue`, the unsubscription of node `node` from channel `idx`
    /// (`SUNSUBSCRIBE` when `sharded`).
    pub fn write_unsubscribe(
        &mut self,
        node: usize,
        idx: usize,
        sharded: bool,
        queue: impl FnOnce(&mut dyn FnMut(&mut Vec<u8>)),
    ) {
        let ch = &mut self.channels[idx];
        if sharded {
            ch.leaving[node] += 1;
            let name = &ch.sharded;
            queue(&mut |out| resp::encode_command(out, &[b"SUNSUBSCRIBE", name]));
        } else {
            let name = &ch.name;
            queue(&mut |out| resp::encode_command(out, &[b"UNSUBSCRIBE", name]));
        }
    }

    /// Drops the caller's references to its channels; those nobody holds any more are left
    /// in [`changed`](Self::changed), to be unsubscribed from.
    pub fn remove(&mut self, caller: CallerId, run: u64, mail: &mut Mail) {
        self.changed.clear();
        let c = mail.caller(caller);
        c.await_subscribed = false;
        c.awaiting = 0;
        while let Some(idx) = mail.caller(caller).chans.pop() {
            let ch = &mut self.channels[idx];
            ch.refs = ch.refs.saturating_sub(1);
            ch.waiters.retain(|&w| w != (caller, run));
            for a in &mut ch.awaiting {
                a.retain(|&w| w != (caller, run));
            }
            if ch.refs == 0 {
                self.changed.push(idx);
            }
        }
    }

    /// One confirmation owed by `node` for channel `idx` will not come (its subscription was
    /// answered with an error, or is sent elsewhere): the callers waiting for it are told
    /// when none is owed any more.
    pub fn not_owed(&mut self, node: usize, idx: usize, mail: &mut Mail) {
        let ch = &mut self.channels[idx];
        ch.owed[node] = ch.owed[node].saturating_sub(1);
        if ch.owed[node] == 0 {
            for (caller, run) in ch.awaiting[node].drain(..) {
                mail.confirmed(caller, run);
            }
        }
    }

    /// Moves the callers waiting for node `from`'s confirmations of channel `idx` to wait
    /// for `to`'s (the subscription was sent there instead).
    pub fn move_awaiting(&mut self, idx: usize, from: usize, to: usize) {
        let ch = &mut self.channels[idx];
        ch.owed[from] = ch.owed[from].saturating_sub(1);
        if ch.owed[from] == 0 && ch.owed[to] > 0 {
            let moved = std::mem::take(&mut ch.awaiting[from]);
            for w in moved {
                if !ch.awaiting[to].contains(&w) {
                    ch.awaiting[to].push(w);
                }
            }
        }
    }

    /// The channels subscribed (or subscribing) on `link` for cluster member `member` whose
    /// slot is `slot` and that are still owed a confirmation there: those an error reply on
    /// `link`'s pub/sub connection about `slot` answered.
    pub fn owed_at(&self, link: usize, member: usize, slot: u16) -> Vec<usize> {
        (0..self.channels.len())
            .filter(|&k| {
                let ch = &self.channels[k];
                ch.slot == slot && ch.on[member] == Some(link) && ch.owed[link] > 0
            })
            .collect()
    }

    /// One message on node `node`'s pub/sub connection (`node` is a link of quorum member
    /// `member`, or the member itself): a confirmation is counted, a published message posted
    /// to the callers of its channel as `member`'s.
    pub fn handle_push(
        &mut self,
        node: usize,
        member: usize,
        bytes: &[u8],
        limits: &Limits,
        mail: &mut Mail,
    ) -> Push {
        let items = match resp::decode(bytes, limits) {
            Ok(Status::Complete((Reply::Array(Some(items)), _))) => items,
            Ok(Status::Complete((Reply::Error(_), _))) => return Push::Error(bytes.to_vec()),
            _ => return Push::Nothing,
        };
        let (Some(Reply::Bulk(Some(kind))), Some(Reply::Bulk(Some(name)))) =
            (items.first(), items.get(1))
        else {
            return Push::Nothing;
        };
        let sharded = matches!(*kind, b"smessage" | b"ssubscribe" | b"sunsubscribe");
        let Some(idx) = self.channels.iter().position(|c| {
            if sharded {
                c.sharded == *name
            } else {
                c.name == *name
            }
        }) else {
            return Push::Nothing;
        };
        let ch = &mut self.channels[idx];
        match *kind {
            b"message" | b"smessage" => {
                let message = match items.get(2) {
                    Some(Reply::Bulk(Some(m))) => *m,
                    _ => &[],
                };
                for &(caller, run) in &ch.waiters {
                    mail.post_wake(caller, run, member, name, message);
                }
            }
            b"subscribe" | b"ssubscribe" if ch.owed[node] > 0 => self.not_owed(node, idx, mail),
            b"sunsubscribe" => {
                if ch.leaving[node] > 0 {
                    ch.leaving[node] -= 1;
                } else if ch.on.get(member) == Some(&Some(node)) {
                    // The slot left this master: it dropped every subscription to the
                    // channels in it.
                    ch.on[member] = None;
                    if ch.refs > 0 {
                        return Push::Dropped(idx);
                    }
                }
            }
            _ => {}
        }
        Push::Nothing
    }

    /// Node `node`'s pub/sub connection failed: its confirmations will not come, so nobody
    /// waits for them, and it is subscribed to nothing. (A lost subscriber only costs
    /// wake-ups; the retry delay is the backstop.)
    pub fn lost_subscriber(&mut self, node: usize, mail: &mut Mail) {
        for ch in &mut self.channels {
            ch.owed[node] = 0;
            ch.leaving[node] = 0;
            for on in &mut ch.on {
                if *on == Some(node) {
                    *on = None;
                }
            }
            for (caller, run) in ch.awaiting[node].drain(..) {
                mail.confirmed(caller, run);
            }
        }
    }
}

impl Endpoint {
    /// Subscribes the caller to the channels `m` writes for `t` (see [`Channels`]).
    pub(super) fn subscribe<M: Machine>(
        &mut self,
        t: &Transmit,
        m: &mut M,
        caller: CallerId,
        run: u64,
        now: Instant,
    ) {
        self.channels
            .add(t, m, caller, run, &self.config.limits, &mut self.mail);
        for k in 0..self.channels.changed.len() {
            let idx = self.channels.changed[k];
            for i in 0..self.members {
                if self.topo[i].is_some() {
                    self.subscribe_sharded(i, idx, now);
                } else {
                    self.subscribe_on(i, idx, now);
                }
            }
        }
        self.channels
            .await_confirmations(caller, run, &mut self.mail);
    }

    /// Subscribes node `i`'s pub/sub connection to channel `idx`, connecting it first if it is
    /// down and due (then every live channel of that connection is subscribed to); `false`
    /// when it cannot be now (a connection in its backoff).
    pub(super) fn subscribe_on(&mut self, i: usize, idx: usize, now: Instant) -> bool {
        if self.is_free(i) || self.without_master(i).is_some() {
            return false;
        }
        let member = self.nodes[i].member;
        let sharded = self.topo[member].is_some().then_some(member);
        let node = &mut self.nodes[i];
        if !node.sub.can_send(now) {
            return false;
        }
        let fresh = node.sub.is_down();
        if fresh {
            let addr = match &node.addr {
                Some(a) => a,
                None => &self.config.nodes[i],
            };
            node.sub.start(addr, sharded.is_some(), now);
            self.io
                .push_back(Io::Connect(ConnId { node: i, sub: true }));
        }
        let sub = &mut self.nodes[i].sub;
        self.channels
            .write_subscribe(i, Some(idx), fresh, sharded, |write| {
                sub.queue_unmatched(|out| write(out))
            });
        self.touch(ConnId { node: i, sub: true });
        true
    }

    /// Unsubscribes node `i`'s pub/sub connection from channel `idx`, if it is up.
    pub(super) fn unsubscribe_on(&mut self, i: usize, idx: usize, sharded: bool) {
        let sub = &mut self.nodes[i].sub;
        if sub.is_up() {
            self.channels.write_unsubscribe(i, idx, sharded, |write| {
                sub.queue_unmatched(|out| write(out))
            });
            self.dirty.insert(ConnId { node: i, sub: true }.index());
        }
    }

    /// Drops the caller's references to its channels; those nobody holds any more are
    /// unsubscribed from.
    pub(super) fn unsubscribe(&mut self, caller: CallerId, run: u64, _now: Instant) {
        self.channels.remove(caller, run, &mut self.mail);
        for k in 0..self.channels.changed.len() {
            let idx = self.channels.changed[k];
            for i in 0..self.members {
                if self.topo[i].is_none() {
                    self.unsubscribe_on(i, idx, false);
                } else if let Some(link) = self.channels.on(idx, i) {
                    self.channels.set_on(idx, i, None);
                    self.unsubscribe_on(link, idx, true);
                }
            }
        }
    }

    /// Subscribes cluster member `member` to channel `idx`: on the link of the master that
    /// owns the channel's slot, as the slot map says (the seed link while no map was read,
    /// or while the slot has no master: the cluster answers where it is).
    pub(super) fn subscribe_sharded(&mut self, member: usize, idx: usize, now: Instant) {
        self.refresh_if_due(member, now);
        let slot = self.channels.slot(idx);
        let link = self.topo[member]
            .as_ref()
            .and_then(|t| t.link(slot))
            .unwrap_or(member);
        self.channels.set_on(idx, member, Some(link));
        if !self.subscribe_on(link, idx, now) {
            // Its connection waits out its backoff: tried again after the next topology read.
            self.channels.set_on(idx, member, None);
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
    }

    /// After a topology read of cluster member `member`: every channel callers hold is
    /// subscribed to at the master its slot's map names, and unsubscribed from where it was.
    pub(super) fn resubscribe(&mut self, member: usize, now: Instant) {
        for idx in 0..self.channels.len() {
            if !self.channels.held(idx) {
                continue;
            }
            let slot = self.channels.slot(idx);
            let want = self.topo[member].as_ref().and_then(|t| t.link(slot));
            let was = self.channels.on(idx, member);
            if was == want && want.is_some() {
                continue;
            }
            if let Some(old) = was {
                self.channels.set_on(idx, member, None);
                self.unsubscribe_on(old, idx, true);
            }
            if want.is_some() {
                self.subscribe_sharded(member, idx, now);
            }
        }
    }

    /// What a message on node `i`'s pub/sub connection asked for, on a cluster member: a
    /// channel whose slot left the master is subscribed to where the map says its slot is
    /// (a stale map is corrected by the `-MOVED` that answers, and a topology read is asked
    /// for); a `-MOVED` answer moves the slot in the map and sends the subscriptions it
    /// answered to the master named. Any other error leaves the channels it answered to the
    /// next topology read: their waiters are not kept waiting for a confirmation.
    pub(super) fn handle_sharded_push(&mut self, i: usize, push: Push, now: Instant) {
        let member = self.nodes[i].member;
        if self.topo[member].is_none() {
            return;
        }
        match push {
            Push::Nothing => {}
            Push::Dropped(idx) => {
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.want = true;
                }
                self.subscribe_sharded(member, idx, now);
            }
            Push::Error(bytes) => {
                let from = match self.node_addr(i).target(self.nodes[i].sub.trying) {
                    Target::Tcp(a) => Some(a),
                    Target::Unix(_) => None,
                };
                let redirect = cluster::redirect(&bytes, from);
                let slot = match redirect {
                    Some(r) => r.slot,
                    // An error without a slot answers the oldest subscription still owed.
                    None => match (0..self.channels.len()).find(|&k| {
                        self.channels.on(k, member) == Some(i)
                            && !self
                                .channels
                                .owed_at(i, member, self.channels.slot(k))
                                .is_empty()
                    }) {
                        Some(k) => self.channels.slot(k),
                        None => return,
                    },
                };
                let answered = self.channels.owed_at(i, member, slot);
                let target = redirect
                    .filter(|r| !r.ask)
                    .and_then(|r| r.to)
                    .and_then(|a| self.link_for(member, a, now))
                    .filter(|&t| t != i);
                if let Some(topo) = self.topo[member].as_mut() {
                    if let Some(t) = target {
                        topo.set(slot, t);
                    }
                    topo.want = true;
                }
                // One error answers one subscription.
                let Some(&idx) = answered.first() else {
                    return;
                };
                match target {
                    Some(t) => {
                        self.channels.set_on(idx, member, Some(t));
                        if self.subscribe_on(t, idx, now) {
                            self.channels.move_awaiting(idx, i, t);
                        } else {
                            self.channels.set_on(idx, member, None);
                            self.channels.not_owed(i, idx, &mut self.mail);
                        }
                    }
                    None => {
                        self.channels.set_on(idx, member, None);
                        self.channels.not_owed(i, idx, &mut self.mail);
                    }
                }
            }
        }
    }
}
