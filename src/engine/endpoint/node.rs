//! A node's lifecycle: its command connection is started when due, set up, failed (with its
//! backoff, and the slow-node breaker's judgement of lagging nodes), and what it owes is
//! queued again on the next connection.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::bits::Bits;
use super::conn::{Redo, Slot};
use super::mail::Event;
use super::setup::Setup;
use super::{ConnId, Endpoint, Io, Node, Retry, GIVEN};
use crate::error::NodeErrorKind;

impl Endpoint {
    /// Whether node `i`'s command connection still owes a reply to a command queued more than
    /// the node timeout ago. (The shell reads what has come first: see
    /// [`late_nodes`](Self::late_nodes).)
    pub(super) fn lagging(&self, i: usize, now: Instant) -> bool {
        self.nodes[i]
            .cmd
            .oldest_reply_since()
            .is_some_and(|sent| now.saturating_duration_since(sent) >= self.config.node_timeout)
    }

    /// The nodes whose command connection owes a reply older than the node timeout, into
    /// `into` (emptied first): a shell that reads only when someone waits should read those
    /// before a caller steps, so that replies that came but were not read yet do not make an
    /// acquisition skip them.
    pub fn late_nodes(&self, now: Instant, into: &mut Bits) {
        into.clear();
        for i in (0..self.nodes.len()).filter(|&i| self.lagging(i, now)) {
            into.insert(i);
        }
    }

    /// Starts a connection to node `i` for commands if it is down and due, with the
    /// compare-and-deletes of its broken connections first behind the setup.
    pub(super) fn connect_if_down(&mut self, i: usize, now: Instant) {
        // The connection's own state first: it is up on nearly every call.
        let cmd = &self.nodes[i].cmd;
        if !cmd.is_down() || !cmd.can_send(now) {
            return;
        }
        if self.is_free(i) || self.without_master(i).is_some() {
            return;
        }
        let node = &mut self.nodes[i];
        let why = node.cmd.down_reason();
        let addr = match &node.addr {
            Some(a) => a,
            None => &self.config.nodes[i],
        };
        node.cmd.start(addr, self.topo[node.member].is_some(), now);
        self.dirty.insert(
            ConnId {
                node: i,
                sub: false,
            }
            .index(),
        );
        self.io.push_back(Io::Connect(ConnId {
            node: i,
            sub: false,
        }));
        self.requeue(i, why, now);
    }

    /// Queues on node `i`'s command connection (up, or just started) the compare-and-deletes
    /// kept for it, those still worth sending; the owners still waiting for the others hear
    /// `why` they were not sent.
    pub(super) fn requeue(&mut self, i: usize, why: NodeErrorKind, now: Instant) {
        let node = &mut self.nodes[i];
        node.again_at = None;
        let member = node.member;
        if i == member && self.topo[member].as_ref().is_some_and(|t| t.known) {
            // A cluster member's seed link keeps what no master serves yet: it goes to the
            // master the topology names (see `reroute_retries`), never to whichever node the
            // seed reaches (a replica, or a master that would redirect it to the dead one).
            return;
        }
        let mut retries = std::mem::take(&mut node.retries);
        let mut bytes = std::mem::take(&mut node.retry_bytes);
        let mut at = 0;
        for r in &retries {
            let end = at + r.redo.len as usize;
            if r.redo.until > now {
                // Written on the new connection, it gets a node timeout from then on.
                self.queue_owed(i, r.slot.resent(now), r.redo, &bytes[at..end]);
            } else if let Slot::Reply {
                caller,
                run,
                tag,
                fired: false,
                ..
            } = r.slot
            {
                // Not sent again (what it deletes has expired anyway), but its owner may still
                // wait: it hears why the node could not be reached.
                self.mail.post(
                    caller as usize,
                    run,
                    Event::Failure {
                        node: member,
                        tag,
                        why: why.clone(),
                    },
                );
            }
            at = end;
        }
        self.wait_after_owed(i);
        // Nothing was kept meanwhile: the buffers are reused.
        retries.clear();
        bytes.clear();
        let node = &mut self.nodes[i];
        node.retries = retries;
        node.retry_bytes = bytes;
    }

    /// Node `i`'s command connection has answered its whole setup: the node's server is what
    /// it said, and what waited behind the setup goes out (see the module docs for what a
    /// changed server and a duplicate one mean).
    pub(super) fn set_up(&mut self, i: usize, now: Instant) {
        let mut learnt = self.nodes[i].cmd.learnt;
        learnt.caps.sharded = self.topo[self.nodes[i].member].is_some();
        // The links of one cluster member may reach one server twice (its seed link and a
        // master's); servers of two members may not be one.
        let member = self.nodes[i].member;
        let twin = learnt.run_id.and_then(|id| {
            (0..self.nodes.len()).find(|&j| {
                self.nodes[j].member != member && self.nodes[j].server.run_id == Some(id)
            })
        });
        let id = ConnId {
            node: i,
            sub: false,
        };
        if let Some(j) = twin {
            let node = self.nodes[j].member;
            let why = Setup::Info.failed(NodeErrorKind::SameServer { node });
            self.fail(id, why, now);
            self.io.push_back(Io::Close(id));
            return;
        }
        let changed = learnt.caps != self.nodes[i].server.caps;
        self.nodes[i].server = learnt;
        self.nodes[i].known = true;
        if changed && self.nodes[i].cmd.holds_fresh_commands() {
            // Written for the server the node was: they must not run on the one it is.
            self.fail(id, NodeErrorKind::ServerChanged, now);
            self.io.push_back(Io::Close(id));
            return;
        }
        self.nodes[i].cmd.release_held();
        self.touch(id);
    }

    pub(super) fn fail(&mut self, id: ConnId, why: NodeErrorKind, now: Instant) {
        let i = id.node;
        if self.is_sentinel_link(i) {
            return match id.sub {
                false => self.sentinel_failed(i, why, now),
                true => self.sentinel_sub_failed(i, why, now),
            };
        }
        if !id.sub && i < self.members {
            // A master named by sentinels: they are asked again.
            self.suspect_master(i, now);
        }
        if id.sub {
            let node = &mut self.nodes[i];
            node.sub.fail(why, now, |_, _| {});
            self.channels.lost_subscriber(i, &mut self.mail);
            if let Some(topo) = self.topo[self.nodes[i].member].as_mut() {
                // Its channels are subscribed to again after the next topology read, at
                // whichever masters own their slots then.
                topo.want = true;
            }
            return;
        }
        let member = self.nodes[i].member;
        if self.nodes[i].cmd.is_up() {
            self.stats.disconnect(member);
        }
        // What this connection answered says nothing of the next one's server (a restart, a
        // failover): every release goes there again.
        self.nodes[i].given = [None; GIVEN];
        if let Some(topo) = self.topo[member].as_mut() {
            // A topology read on it is lost, and the cluster may have changed.
            topo.asked = None;
            topo.want = true;
        }
        let Node {
            cmd,
            retries,
            retry_bytes,
            kept,
            awaiting,
            unconfirmed,
            ..
        } = &mut self.nodes[i];
        kept.clear();
        // The cleanups it ran that no `WAIT` confirmed go again, with theirs, on the next
        // connection (to the master promoted in a failover, which may not have had them).
        unconfirmed.drain(now, |redo, bytes| {
            retry_bytes.extend_from_slice(bytes);
            retries.push(Retry {
                slot: Slot::Discard {
                    redo: None,
                    given: None,
                },
                redo,
            });
        });
        if let Some(a) = awaiting.take() {
            // Its `WAIT` will not answer: the write does not count.
            if let Slot::Reply {
                caller, run, tag, ..
            } = a.slot
            {
                self.mail.post(
                    caller as usize,
                    run,
                    Event::Failure {
                        node: member,
                        tag,
                        why: why.clone(),
                    },
                );
            }
            // A compare-and-delete stays owed, first of those of this connection.
            if let Some(redo) = a.slot.redo().filter(|r| r.until > now) {
                retry_bytes.extend_from_slice(&a.command);
                retries.push(Retry {
                    slot: Slot::Discard {
                        redo: None,
                        given: None,
                    },
                    redo: Redo {
                        len: a.command.len() as u32,
                        ..redo
                    },
                });
            }
        }
        let mail = &mut self.mail;
        cmd.fail(why.clone(), now, |slot, bytes| {
            let redo = match slot {
                Slot::Reply { redo, .. } | Slot::Discard { redo, .. } => redo,
                _ => None,
            };
            match (redo.filter(|r| r.until > now), bytes) {
                // Sent again on the next connection; its owner, if it still waits, gets
                // that reply.
                (Some(redo), Some(bytes)) => {
                    retry_bytes.extend_from_slice(bytes);
                    retries.push(Retry { slot, redo });
                }
                _ => {
                    if let Slot::Reply {
                        caller, run, tag, ..
                    } = slot
                    {
                        mail.post(
                            caller as usize,
                            run,
                            Event::Failure {
                                node: member,
                                tag,
                                why: why.clone(),
                            },
                        );
                    }
                }
            }
        });
        // The slot map may have moved their slots already (a connect to a master that died,
        // tried again after the topology named its successor).
        self.reroute_retries(member, now);
    }
}
