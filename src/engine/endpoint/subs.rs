//! Wake channels: which callers listen to which channel, the subscriptions each node's pub/sub
//! connection owes a confirmation for, and the delivery of release announcements.
//!
//! Subscriptions are counted per channel: the first caller of a channel subscribes every pub/sub
//! connection to it, the last one unsubscribes them. A published message goes to the callers
//! of its channel only. A caller is told it is subscribed once every confirmation owed for its
//! channels on every node has come (or that node's pub/sub connection failed).
#![forbid(unsafe_code)]

use super::mail::{Event, Mail};
use super::CallerId;
use crate::engine::machine::{Machine, Transmit};
use crate::engine::ops::Caps;
use crate::resp::{self, Limits, Reply, Status};

/// A wake channel the pub/sub connections are (being) subscribed to.
#[derive(Debug)]
struct Channel {
    name: Vec<u8>,
    /// Callers holding it; unsubscribed when this drops to zero.
    refs: usize,
    /// The callers (caller, run) to wake on a message.
    waiters: Vec<(CallerId, u64)>,
    /// Per node, confirmations owed for the SUBSCRIBE commands sent.
    owed: Vec<u32>,
    /// Per node, the callers waiting for those confirmations.
    awaiting: Vec<Vec<(CallerId, u64)>>,
}

#[derive(Debug)]
pub(crate) struct Channels {
    nodes: usize,
    channels: Vec<Channel>,
    /// Where a machine's subscription is written before it is read back for its channels.
    scratch: Vec<u8>,
    /// The channels the last [`add`](Channels::add) took from no caller to one, or the last
    /// [`remove`](Channels::remove) from one to none.
    pub changed: Vec<usize>,
}

impl Channels {
    pub fn new(nodes: usize) -> Channels {
        Channels {
            nodes,
            channels: Vec::new(),
            scratch: Vec::new(),
            changed: Vec::new(),
        }
    }

    /// Adds the caller to the channels `m` subscribes to with `t`. The channels nobody held
    /// before are left in [`changed`](Self::changed): they are to be subscribed to on every
    /// node.
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
        let mut rest = &scratch[..];
        while let Ok(Status::Complete((Reply::Array(Some(items)), used))) =
            resp::decode(rest, limits)
        {
            rest = &rest[used..];
            for item in items.iter().skip(1) {
                let Reply::Bulk(Some(name)) = item else {
                    continue;
                };
                let idx = self.index_of(name);
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
        }
        self.scratch = scratch;
    }

    /// The channel named `name`, made (or a slot nobody uses reused) if there is none.
    fn index_of(&mut self, name: &[u8]) -> usize {
        if let Some(idx) = self.channels.iter().position(|c| c.name == name) {
            return idx;
        }
        let fresh = Channel {
            name: name.to_vec(),
            refs: 0,
            waiters: Vec::new(),
            owed: vec![0; self.nodes],
            awaiting: (0..self.nodes).map(|_| Vec::new()).collect(),
        };
        match self
            .channels
            .iter()
            .position(|c| c.refs == 0 && c.owed.iter().all(|&o| o == 0))
        {
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
    /// `idx`, or on a fresh connection every channel somebody holds.
    pub fn write_subscribe(
        &mut self,
        node: usize,
        idx: Option<usize>,
        fresh: bool,
        mut queue: impl FnMut(&mut dyn FnMut(&mut Vec<u8>)),
    ) {
        for (k, ch) in self.channels.iter_mut().enumerate() {
            let wanted = if fresh { ch.refs > 0 } else { Some(k) == idx };
            if wanted {
                queue(&mut |out| resp::encode_command(out, &[b"SUBSCRIBE", &ch.name]));
                ch.owed[node] += 1;
            }
        }
    }

    /// Writes, with `queue`, the unsubscription from channel `idx`.
    pub fn write_unsubscribe(&self, idx: usize, queue: impl FnOnce(&mut dyn FnMut(&mut Vec<u8>))) {
        let name = &self.channels[idx].name;
        queue(&mut |out| resp::encode_command(out, &[b"UNSUBSCRIBE", name]));
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

    /// One message on node `node`'s pub/sub connection: a confirmation is counted, a
    /// published message posted to the callers of its channel.
    pub fn handle_push(&mut self, node: usize, bytes: &[u8], limits: &Limits, mail: &mut Mail) {
        let Ok(Status::Complete((Reply::Array(Some(items)), _))) = resp::decode(bytes, limits)
        else {
            return;
        };
        let (Some(Reply::Bulk(Some(kind))), Some(Reply::Bulk(Some(name)))) =
            (items.first(), items.get(1))
        else {
            return;
        };
        let Some(ch) = self.channels.iter_mut().find(|c| c.name == *name) else {
            return;
        };
        match *kind {
            b"message" => {
                let message = match items.get(2) {
                    Some(Reply::Bulk(Some(m))) => *m,
                    _ => &[],
                };
                for &(caller, run) in &ch.waiters {
                    mail.post_wake(caller, run, node, name, message);
                }
            }
            b"subscribe" => {
                if let Some(owed) = ch.owed.get_mut(node) {
                    *owed = owed.saturating_sub(1);
                    if *owed == 0 {
                        for (caller, run) in ch.awaiting[node].drain(..) {
                            mail.confirmed(caller, run);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Node `node`'s pub/sub connection failed: its confirmations will not come, so nobody
    /// waits for them. (A lost subscriber only costs wake-ups; the retry delay is the backstop.)
    pub fn lost_subscriber(&mut self, node: usize, mail: &mut Mail) {
        for ch in &mut self.channels {
            ch.owed[node] = 0;
            for (caller, run) in ch.awaiting[node].drain(..) {
                mail.confirmed(caller, run);
            }
        }
    }
}
