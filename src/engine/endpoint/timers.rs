//! The endpoint's timers: when it next has work to do without any I/O, and that work.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::close::CLOSE_STALL;
use super::conn::Slot;
use super::mail::Event;
use super::{ConnId, Endpoint, Io};
use crate::error::{NodeErrorKind, TlsFailure};

impl Endpoint {
    /// When [`handle_timeout`](Self::handle_timeout) has work to do: a command whose node
    /// timeout passes, a connect that may be overdue, a node whose compare-and-deletes wait for
    /// its backoff to pass, the end of closing. The shell reads every connection before it
    /// acts on a passed node timeout, so that a reply that came but was not read yet is never
    /// taken for a timeout.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let connect = self.config.connect_timeout;
        let mut next = self.closing.map(|c| c.until.min(c.progress + CLOSE_STALL));
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for topo in self.topo.iter().flatten() {
            consider(topo.due());
        }
        consider(self.sentinels_due());
        // A Sentinel member without a master named cannot connect: what it keeps waits for
        // the sentinels' answer (their round is due above), not for its backoff.
        for i in 0..self.nodes.len() {
            let masterless = !self.nodes[i].retries.is_empty() && self.without_master(i).is_some();
            let n = &mut self.nodes[i];
            consider(n.unconfirmed.due(&n.cmd));
            consider(n.cmd.next_due());
            consider(n.cmd.connecting_since().map(|s| s + connect));
            consider(n.sub.connecting_since().map(|s| s + connect));
            if !n.retries.is_empty() {
                if !masterless {
                    consider(n.cmd.retry_at());
                }
                if !n.cmd.is_down() {
                    consider(n.again_at);
                }
                // An owner waiting for a release kept to send again hears by its node timeout.
                for r in &n.retries {
                    if let Slot::Reply {
                        due, fired: false, ..
                    } = r.slot
                    {
                        consider(Some(due));
                    }
                }
            }
        }
        next
    }

    /// Tells the owner of every command whose node timeout passed by `now` that the node timed
    /// out for it (the one place that decides it), fails the connects that took longer than
    /// the connect timeout, and reconnects the nodes whose compare-and-deletes wait, once their
    /// backoff has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let connect = self.config.connect_timeout;
        for i in 0..self.nodes.len() {
            let mail = &mut self.mail;
            let member = self.nodes[i].member;
            self.nodes[i].cmd.fire_due(now, |slot| {
                if let Slot::Reply {
                    caller, run, tag, ..
                } = *slot
                {
                    mail.post(
                        caller as usize,
                        run,
                        Event::Failure {
                            node: member,
                            tag,
                            why: NodeErrorKind::Timeout,
                        },
                    );
                }
            });
            for sub in [false, true] {
                let id = ConnId { node: i, sub };
                let overdue = self
                    .conn(id)
                    .connecting_since()
                    .is_some_and(|s| now.saturating_duration_since(s) >= connect);
                if overdue {
                    self.io.push_back(Io::Close(id));
                    // A TLS handshake unanswered at the connect timeout, on a stream that is
                    // connected: a plaintext Redis reads a TLS hello as the start of a command
                    // line, and waits for its end without a word. A configuration error.
                    let why = if self.conn(id).is_handshaking() && self.node_addr(i).tls {
                        NodeErrorKind::Setup {
                            command: "TLS",
                            cause: Box::new(NodeErrorKind::Tls(TlsFailure::NotTls)),
                        }
                    } else {
                        NodeErrorKind::Connect(std::io::ErrorKind::TimedOut)
                    };
                    self.handle_connect_failed(id, why, now);
                }
            }
            self.confirm_if_idle(i, now);
            let node = &mut self.nodes[i];
            if !node.retries.is_empty() {
                // A release kept to send again while its node is unreachable: its owner, if it
                // still waits, counts the node as timed out once the node timeout of what it
                // sent passes (or the release is given up); the release is still sent again,
                // and a reply that comes later still reaches the owner, as any late reply does.
                let expired = node.retries.iter().all(|r| r.redo.until <= now);
                for r in &mut node.retries {
                    if let Slot::Reply {
                        caller,
                        run,
                        tag,
                        due,
                        ref mut fired,
                        ..
                    } = r.slot
                    {
                        if !*fired && (due <= now || expired) {
                            *fired = true;
                            self.mail.post(
                                caller as usize,
                                run,
                                Event::Failure {
                                    node: member,
                                    tag,
                                    why: NodeErrorKind::Timeout,
                                },
                            );
                        }
                    }
                }
                if expired {
                    node.retries.clear();
                    node.retry_bytes.clear();
                    node.again_at = None;
                } else if !node.cmd.is_down() && node.again_at.is_some_and(|t| t <= now) {
                    // Refused a moment ago, on a connection that is still up: sent again.
                    self.requeue(i, NodeErrorKind::Timeout, now);
                    self.touch(ConnId {
                        node: i,
                        sub: false,
                    });
                } else {
                    self.connect_if_down(i, now);
                }
            }
        }
        for member in 0..self.members {
            self.refresh_if_due(member, now);
        }
    }
}
