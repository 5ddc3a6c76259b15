//! The send path: a caller's transmit queued on a node's command connection (or kept for its
//! next one, or failed at once), the `WAIT`s after writes that must reach replicas, and the
//! compare-and-deletes owed again after a refusal or a broken connection.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::conn::{self, Conn, Redo, Refused, Slot, BACKOFF_MAX, MAX_OWED};
use super::{CallerId, ConnId, Endpoint, Refusal, Retry};
use crate::engine::machine::{Machine, Transmit, What};
use crate::engine::timings;
use crate::error::NodeErrorKind;
use crate::rng::Entropy;

impl Endpoint {
    /// Queues `t` on node `i`'s command connection (see [`step`](Self::step)).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_to<M: Machine>(
        &mut self,
        member: usize,
        t: &Transmit,
        m: &mut M,
        caller: CallerId,
        run: u64,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        let i = match self.topo[member] {
            None => member,
            Some(_) => match self.route(member, t, m, now) {
                Ok(link) => link,
                Err(why) => {
                    // No master serves the key's slot (the cluster electing one, its master
                    // marked failed): as on a node that is down, a compare-and-delete is kept
                    // for the member (on its seed link, which never serves a slot) and goes to
                    // the master the topology names next (see `reroute_retries`); anything
                    // else fails.
                    match (t.what, t.redo) {
                        (What::Acquire { token }, _) => self.nodes[member].unsent(token),
                        (What::Cleanup { token }, _) if self.nodes[member].was_unsent(token) => {}
                        (_, Some(until)) => self.retry_later(member, t, m, until),
                        _ => {}
                    }
                    if let Some(tag) = t.tag {
                        m.handle_failure(member, tag, why, now, rng);
                    }
                    return;
                }
            },
        };
        if let (None, What::Cleanup { token } | What::GiveBack { token }) = (t.tag, t.what) {
            if self.nodes[i].was_unsent(token) {
                // The attempt never went there: nothing of it to delete.
                return;
            }
        }
        if let (Some(tag), What::Release { token }) = (t.tag, t.what) {
            if self.gives_back(member) {
                if self.nodes[i].was_given(token) {
                    // The node answered the holder's give-back, the same compare-and-delete,
                    // on the connection it has now, which has not failed since: nothing of
                    // the holder is left there, and that answer is the release's.
                    self.mail.post_reply(caller, run, member, tag, b":1\r\n");
                    return;
                }
                let owner = (caller as u32, run, tag);
                let timeout = self.config.node_timeout;
                if self.nodes[i].cmd.adopt(token, owner, t.redo, now, timeout) {
                    // The give-back is on its way there: its answer is the release's.
                    return;
                }
            }
        }
        if let Some(why) = self.without_master(i) {
            // No master named yet: as on a node that is down, a compare-and-delete waits for
            // the next connection (to whichever master is named), anything else fails.
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            if let Some(until) = t.redo {
                self.retry_later(i, t, m, until);
            }
            if let Some(tag) = t.tag {
                m.handle_failure(member, tag, why, now, rng);
            }
            return;
        }
        let conn = &self.nodes[i].cmd;
        let Some(tag) = t.tag else {
            // Nobody reads its reply (a cleanup, a queue leave): it goes where something of
            // ours may be. A compare-and-delete for a node that cannot be sent to now waits for
            // its next connection.
            if !conn.can_send(now) {
                if let Some(until) = t.redo {
                    self.retry_later(i, t, m, until);
                }
                return;
            }
            // A compare-and-delete is never turned away for the backlog: it is what lets the
            // node drain, and what the backlog may have set there waits for it.
            if t.redo.is_none() && (conn.is_down() || conn.owed() >= MAX_OWED) {
                return;
            }
            self.connect_if_down(i, now);
            self.touch(ConnId {
                node: i,
                sub: false,
            });
            let caps = self.nodes[i].server.caps;
            let encoded = &mut self.encoded;
            let given = match t.what {
                What::GiveBack { token } => Some(token),
                _ => None,
            };
            self.nodes[i]
                .cmd
                .queue(Slot::Discard { redo: None, given }, t.redo, |out| {
                    encoded.write(caps, out, |out| m.encode(t, caps, out))
                });
            // A cleanup's first try has no `WAIT` of its own (every lost attempt sends one to
            // every node: a `WAIT` behind each would hold up the connection); it counts once
            // a later `WAIT` on its connection says so (see the `confirm` module). Sent again,
            // it has its own.
            self.keep_sent(i, false);
            return;
        };
        // A node whose setup was refused votes with that refusal until a setup goes through,
        // reconnecting or not: queued behind a new setup, the vote would come too late for
        // the round to see a configuration error, and a wait would end as contention.
        let refused = conn.setup_error().is_some();
        if !conn.can_send(now) || refused {
            if refused && conn.can_send(now) {
                // Its setup is tried again all the same: a fixed server is found again.
                self.connect_if_down(i, now);
            }
            let why = self.nodes[i].cmd.down_reason();
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            if let Some(until) = t.redo {
                // What the node may hold of ours is deleted once it is reachable again.
                self.retry_later(i, t, m, until);
            }
            m.handle_failure(member, tag, why, now, rng);
            return;
        }
        let backlog = t.redo.is_none() && conn.owed() >= MAX_OWED;
        if backlog || matches!(t.what, What::Acquire { .. }) && self.lagging(i, now) {
            // Behind a backlog that is already past the node timeout, a new acquisition would
            // only time out, and deepen the backlog: callers that win at the quorum without
            // this node would otherwise send it more than it can answer, without end. It
            // counts as timed out at once; releases and cleanups still go (but for the cleanup
            // of this very attempt, which has nothing to delete there).
            if let What::Acquire { token } = t.what {
                self.nodes[i].unsent(token);
            }
            m.handle_failure(member, tag, NodeErrorKind::Timeout, now, rng);
            return;
        }
        self.connect_if_down(i, now);
        let caps = self.nodes[i].server.caps;
        self.touch(ConnId {
            node: i,
            sub: false,
        });
        let encoded = &mut self.encoded;
        self.nodes[i].cmd.queue(
            Slot::Reply {
                caller: caller as u32,
                run,
                tag,
                sent: now,
                redo: None,
                due: timings::node_deadline(now, self.config.node_timeout),
                fired: false,
            },
            t.redo,
            |out| encoded.write(caps, out, |out| m.encode(t, caps, out)),
        );
        // Every write that must outlive a failover: grants, extends, downgrades, fence writes,
        // and releases (one acknowledged by the master alone is lost with it, and the key is
        // left on the replica promoted in its place).
        let wait = self.waits(member)
            && (t.redo.is_some()
                || matches!(
                    t.what,
                    What::Acquire { .. }
                        | What::Extend { .. }
                        | What::Downgrade { .. }
                        | What::FenceWrite { .. }
                ));
        self.keep_sent(i, wait);
        if wait {
            self.queue_wait(i);
        }
    }

    /// On a link of a cluster member, keeps the bytes of the command just queued (the last
    /// encoding) until its reply comes, to follow a redirection (with a `WAIT` after it if
    /// `wait`).
    pub(super) fn keep_sent(&mut self, link: usize, wait: bool) {
        if self.topo[self.nodes[link].member].is_none() {
            return;
        }
        let before = self.encoded.for_caps.map_or(0, |(_, b)| b);
        self.nodes[link]
            .kept
            .push(&self.encoded.bytes, before, 0, wait);
    }

    /// Whether a give-back that member `member` answered stands for its holder's release
    /// there (see `What::GiveBack`): a plain node, whose writes count without a `WAIT` and
    /// whose master no sentinel may change (and not a cluster, whose slots may move).
    pub(super) fn gives_back(&self, member: usize) -> bool {
        self.topo[member].is_none() && self.sentinels[member].is_none() && !self.waits(member)
    }

    /// Whether member `member`'s URL asks its writes to reach replicas (`?wait=N`) or
    /// append-only files (`?waitaof=L,R`) before they count.
    pub(super) fn waits(&self, member: usize) -> bool {
        let node = &self.config.nodes[member];
        node.wait > 0 || node.waitaof.is_some()
    }

    /// Queues on `link`, after a grant (or a compare-and-delete), `WAIT N ms` for the
    /// replicas its member's URL asks a write to reach (`?wait=N`), then `WAITAOF L R ms` for
    /// the append-only fsyncs it asks for (`?waitaof=L,R`), each bounded by the node timeout:
    /// the command's reply is held until they answer, and counts only if every one says
    /// enough.
    pub(super) fn queue_wait(&mut self, link: usize) {
        let node = &self.config.nodes[self.nodes[link].member];
        let ms = (self.config.node_timeout.as_millis() as u64).max(1);
        queue_waits(&mut self.nodes[link].cmd, node.wait, node.waitaof, ms);
    }

    /// Queues on node `i`'s command connection the compare-and-delete `bytes` owed there
    /// (`slot`, `redo`), with the waits after it that its member asks for: one sent again
    /// counts as delivered only once the replicas have it. One whose owner waits for its reply
    /// has its own; one nobody waits for (a cleanup, a release given up on) is confirmed by the
    /// next `WAIT` on the connection, as a cleanup's first try is (see the `confirm` module),
    /// and [`wait_after_owed`](Self::wait_after_owed) queues one after a batch of them: a
    /// `WAIT` behind each would hold up the new connection for as many node timeouts while the
    /// promoted master's replicas attach, and every grant queued behind them.
    pub(super) fn queue_owed(&mut self, i: usize, slot: Slot, redo: Redo, bytes: &[u8]) {
        let member = self.nodes[i].member;
        let confirmed_later = self.waits(member) && matches!(slot, Slot::Discard { .. });
        self.nodes[i].unwaited |= confirmed_later;
        let wait = self.waits(member) && !confirmed_later;
        let ms = (self.config.node_timeout.as_millis() as u64).max(1);
        let (n, aof) = (
            self.config.nodes[member].wait,
            self.config.nodes[member].waitaof,
        );
        let node = &mut self.nodes[i];
        node.cmd.queue_redo(slot, redo, bytes);
        if self.topo[member].is_some() {
            node.kept.push(bytes, redo.before as usize, 0, wait);
        }
        if wait {
            queue_waits(&mut node.cmd, n, aof, ms);
            node.unwaited = false;
        }
    }

    /// Queues on node `i`'s command connection one `WAIT` (and `WAITAOF`) after the
    /// compare-and-deletes just queued again without one (see [`queue_owed`](Self::queue_owed)).
    pub(super) fn wait_after_owed(&mut self, i: usize) {
        if !std::mem::take(&mut self.nodes[i].unwaited) {
            return;
        }
        self.queue_wait(i);
    }

    /// The compare-and-deletes that node `i` answered without running them stay owed, as long
    /// as what they delete may still be there: one answered `NOSCRIPT` goes again at once with
    /// its script's body; one refused for a while (`BUSY`, `TRYAGAIN`, `LOADING`) goes again
    /// after a short backoff that doubles while the node refuses (see
    /// [`handle_timeout`](Self::handle_timeout)). An owner still waiting gets the reply that
    /// is finally given, or its node timeout, as for a release kept after a broken
    /// connection; one not sent again (expired, or nothing to rewrite) gives its owner the
    /// reply as it came.
    ///
    /// A compare-and-delete that ran, but that the replicas (or fsyncs) its member asks for
    /// did not acknowledge in time ([`Refused::Unacknowledged`]), is not sent again on that
    /// connection (the master has run it): a later `WAIT` there confirms it, as a cleanup's
    /// (see the `confirm` module); it goes again on the node's next connection if this one
    /// breaks first, as one of a broken connection.
    ///
    /// While the client closes, replies that were all such refusals (`idle` of those read) are
    /// no progress: a node that refuses what it owes for as long as closing waits is one it
    /// gives up on.
    pub(super) fn owe_again(
        &mut self,
        i: usize,
        refusals: Vec<Refusal>,
        idle: u64,
        was: Option<(Instant, u64)>,
        now: Instant,
    ) {
        if let (Some(c), Some((progress, read))) = (&mut self.closing, was) {
            if idle > 0 && self.nodes[i].cmd.read - read <= idle {
                c.progress = progress;
            }
        }
        if refusals.is_empty() {
            return;
        }
        let member = self.nodes[i].member;
        let mut refused = false;
        for r in refusals {
            let Some(mut redo) = r.slot.redo() else {
                continue;
            };
            // The refusal comes after the node ran every command written before it on this
            // connection, a lock's write that a node slow for its load ran late among them:
            // what it deletes may live on from now for as long as it was worth sending from
            // when it was sent.
            if let Slot::Reply { sent, .. } = r.slot {
                redo.until = redo
                    .until
                    .max(now + redo.until.saturating_duration_since(sent));
            }
            let bytes = match r.kind {
                // Sent again once, with its body: no `NOSCRIPT` can follow, and what it
                // deletes may have been written late, after the time it was kept for.
                Refused::NoScript => conn::with_bodies(&r.command),
                _ if redo.until <= now => None,
                Refused::Transient | Refused::Unacknowledged => Some(r.command),
            };
            let Some(bytes) = bytes else {
                if let Slot::Reply {
                    caller, run, tag, ..
                } = r.slot
                {
                    self.mail
                        .post_reply(caller as usize, run, member, tag, &r.reply);
                }
                continue;
            };
            let redo = Redo {
                len: bytes.len() as u32,
                before: r.before as u32,
                ..redo
            };
            // It ran on this connection, which is still up: a later `WAIT` on it confirms it
            // (see the `confirm` module).
            if r.kind == Refused::Unacknowledged && self.nodes[i].cmd.is_up() {
                self.nodes[i].unconfirmed.push_short(redo, &bytes, now);
                continue;
            }
            if r.kind == Refused::NoScript && self.nodes[i].cmd.is_up() {
                self.queue_owed(i, r.slot, redo, &bytes);
                self.wait_after_owed(i);
                self.touch(ConnId {
                    node: i,
                    sub: false,
                });
                continue;
            }
            let node = &mut self.nodes[i];
            node.retry_bytes.extend_from_slice(&bytes);
            node.retries.push(Retry { slot: r.slot, redo });
            refused |= r.kind == Refused::Transient;
        }
        // (Those kept for a connection that broke meanwhile go on its next one.)
        let node = &mut self.nodes[i];
        if refused && node.again_at.is_none() {
            node.again_at = Some(now + node.again_backoff);
            node.again_backoff = (node.again_backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Keeps the compare-and-delete `t` for node `i`'s next connection.
    pub(super) fn retry_later<M: Machine>(
        &mut self,
        i: usize,
        t: &Transmit,
        m: &M,
        until: Instant,
    ) {
        let node = &mut self.nodes[i];
        let caps = node.server.caps;
        let start = node.retry_bytes.len();
        let before = self
            .encoded
            .write(caps, &mut node.retry_bytes, |out| m.encode(t, caps, out));
        node.retries.push(Retry {
            slot: Slot::Discard {
                redo: None,
                given: None,
            },
            redo: Redo {
                until,
                len: (node.retry_bytes.len() - start) as u32,
                before: before as u32,
            },
        });
    }

    /// Sends on node `i`'s command connection a `WAIT` (and `WAITAOF`) of the endpoint's own
    /// for the cleanups it ran that no `WAIT` confirmed, once it is idle (see the `confirm`
    /// module). It waits a quarter of the node timeout at most: a grant queued behind it still
    /// has its reply within its own.
    pub(super) fn confirm_if_idle(&mut self, i: usize, now: Instant) {
        let node = &mut self.nodes[i];
        if !node.unconfirmed.wants_wait(&node.cmd, now) {
            return;
        }
        let member = &self.config.nodes[node.member];
        let ms = (self.config.node_timeout.as_millis() as u64 / 4).max(1);
        queue_waits(&mut node.cmd, member.wait, member.waitaof, ms);
        self.touch(ConnId {
            node: i,
            sub: false,
        });
    }
}

/// Queues on `cmd` `WAIT n ms` when `n` > 0, then `WAITAOF L R ms` for `aof` (see
/// [`Endpoint::queue_wait`]).
pub(super) fn queue_waits(cmd: &mut Conn, n: u32, aof: Option<(u32, u32)>, ms: u64) {
    if n > 0 {
        cmd.queue(Slot::Wait, None, |out| {
            crate::resp::write_array_len(out, 3);
            crate::resp::write_bulk(out, b"WAIT");
            crate::resp::write_bulk_u64(out, n.into());
            crate::resp::write_bulk_u64(out, ms);
            0
        });
    }
    if let Some((local, replicas)) = aof {
        cmd.queue(Slot::WaitAof, None, |out| {
            crate::resp::write_array_len(out, 4);
            crate::resp::write_bulk(out, b"WAITAOF");
            crate::resp::write_bulk_u64(out, local.into());
            crate::resp::write_bulk_u64(out, replicas.into());
            crate::resp::write_bulk_u64(out, ms);
            0
        });
    }
}
