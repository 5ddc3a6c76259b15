//! The receive path: what a node's connections read. Every reply on a command connection, a
//! plain node's, a Sentinel member's master's or a cluster member's link's, is routed by one
//! path: held for its `WAIT`, kept as a refused compare-and-delete to send again, counted as a
//! cleanup to confirm, remembered as an answered give-back, or posted to its caller's mailbox.
//! On a cluster member's link, one step more: a topology read's reply is read, a `MOVED` or
//! `ASK` sends its command on (see `cluster`), and `CLUSTERDOWN` asks for a topology read.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::confirm::Unconfirmed;
use super::conn::{Refused, Slot, BACKOFF_MIN};
use super::mail::{Event, Mail};
use super::subs::Push;
use super::{cluster, Awaiting, ConnId, Endpoint, Io, Node, Redirected, Refusal, GIVEN};
use crate::error::NodeErrorKind;
use crate::resp::Reply;
use crate::stats::Recorder;

impl Endpoint {
    /// Routes every complete reply read on node `i`'s command connection (see the module
    /// docs); `was` is what closing counted as progress before the read.
    pub(super) fn recv_replies(&mut self, i: usize, was: Option<(Instant, u64)>, now: Instant) {
        let limits = self.config.limits;
        let member = self.nodes[i].member;
        let cluster = self.topo[member].is_some();
        // A plain node's bytes are progress; a cluster link's, once they answer anything but a
        // topology read (the nodes move on with what they owe).
        let mut progress = !cluster;
        if progress {
            if let Some(c) = &mut self.closing {
                c.progress = now;
            }
        }
        // Where a cluster link's redirections are read from.
        let from = if cluster { self.link_target(i) } else { None };
        let mut topology: Vec<Vec<u8>> = Vec::new();
        let mut redirected: Vec<Redirected> = Vec::new();
        let mut refusals: Vec<Refusal> = Vec::new();
        let mut idle = 0;
        let mut readonly = false;
        let mut down = false;
        let wants = (
            self.config.nodes[member].wait,
            self.config.nodes[member].waitaof,
        );
        let confirms = wants.0 > 0 || wants.1.is_some();
        let sentinel = self.sentinels[member].is_some();
        // A give-back answered here stands for its holder's release only where a write counts
        // without a `WAIT`, no sentinel may name another master and no cluster move its slot.
        let plain = !cluster && !sentinel && !confirms;
        let mail = &mut self.mail;
        let stats = &self.stats;
        let Node {
            cmd,
            kept,
            awaiting,
            again_backoff,
            unconfirmed,
            given,
            given_next,
            ..
        } = &mut self.nodes[i];
        let result = cmd.take_replies(&limits, |slot, bytes, command, waits| {
            // A master named by sentinels that refuses writes as a replica was demoted: they
            // are asked again, and what it refused goes to the master they name.
            let demoted = sentinel && bytes.starts_with(b"-READONLY");
            readonly |= demoted;
            match slot {
                Slot::Topology => topology.push(bytes.to_vec()),
                wait_slot @ (Slot::Wait | Slot::WaitAof) => {
                    progress = true;
                    idle += answer_wait(
                        awaiting,
                        Waited {
                            bytes,
                            slot: wait_slot,
                            more: waits,
                            wants,
                            member,
                            now,
                        },
                        &limits,
                        stats,
                        mail,
                        &mut refusals,
                        again_backoff,
                        unconfirmed,
                    );
                }
                Slot::Reply { .. } | Slot::Discard { .. } => {
                    progress = true;
                    // The command: on a cluster link as kept to redirect it (with the
                    // redirections followed), and the redirection its reply asks for (the
                    // cluster's step); on any other node as its connection holds it.
                    let (command, to) = if cluster {
                        let kept = kept.pop();
                        down |= bytes.starts_with(b"-CLUSTERDOWN");
                        let to = if bytes.first() == Some(&b'-') {
                            cluster::redirect(bytes, from)
                        } else {
                            None
                        };
                        (kept, to)
                    } else {
                        let before = slot.redo().map_or(0, |r| r.before as usize);
                        (Some((command, before, 0, waits)), None)
                    };
                    // A compare-and-delete nobody waits for, on a member that waits for
                    // replicas: done once a `WAIT` after it says so, its own or a later one.
                    let confirmed_later = confirms && matches!(slot, Slot::Discard { .. });
                    if let (Some((b, before, _, wait)), Some(redo)) = (command, slot.redo()) {
                        match Refused::of(bytes).or(demoted.then_some(Refused::Transient)) {
                            Some(kind) => {
                                idle += 1;
                                return refusals.push(Refusal {
                                    slot,
                                    kind,
                                    command: b.to_vec(),
                                    before,
                                    reply: bytes.to_vec(),
                                });
                            }
                            // One the replicas must acknowledge is not done yet.
                            None if to.is_none() && confirmed_later => {
                                *again_backoff = BACKOFF_MIN;
                                unconfirmed.push(redo, b);
                            }
                            None if to.is_none() && !wait => *again_backoff = BACKOFF_MIN,
                            None => {}
                        }
                    }
                    if let (Some((b, before, hops, wait)), Some(to)) = (command, to) {
                        return redirected.push(Redirected {
                            to,
                            slot,
                            bytes: b.to_vec(),
                            before,
                            hops,
                            wait,
                            reply: bytes.to_vec(),
                        });
                    }
                    if let Slot::Discard {
                        given: Some(token), ..
                    } = slot
                    {
                        // It ran: an integer (it deleted the key, or found it gone), or the
                        // transaction's with `DELEX`'s integer first.
                        let ran = bytes.starts_with(b":") || bytes.starts_with(b"*2\r\n:");
                        if ran && plain && !waits {
                            given[*given_next] = Some(token);
                            *given_next = (*given_next + 1) % GIVEN;
                        }
                    }
                    // A write's reply counts once its `WAIT` says enough replicas have it.
                    if let Some((b, _, _, true)) = command {
                        if !(confirmed_later && slot.redo().is_some()) {
                            *awaiting = Some(Awaiting::new(slot, bytes, b));
                        }
                        return;
                    }
                    if let Slot::Reply {
                        caller,
                        run,
                        tag,
                        sent,
                        ..
                    } = slot
                    {
                        // Every reply is timed, the late ones too: a round decided at the
                        // quorum must not hide the slowest node's latency.
                        stats.reply(member, now.saturating_duration_since(sent));
                        mail.post_reply(caller as usize, run, member, tag, bytes);
                    }
                }
                _ => {}
            }
        });
        let id = ConnId {
            node: i,
            sub: false,
        };
        if cluster && (progress || matches!(result, Ok(true))) {
            if let Some(c) = &mut self.closing {
                c.progress = now;
            }
        }
        match result {
            Ok(false) => {}
            Ok(true) => self.set_up(i, now),
            Err(why) => {
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
            }
        }
        for bytes in topology {
            self.read_topology(i, &bytes, now);
        }
        for r in redirected {
            self.follow(i, r, now);
        }
        self.owe_again(i, refusals, idle, was, now);
        if readonly && !self.nodes[i].cmd.is_down() {
            let why = NodeErrorKind::Server {
                kind: crate::resp::ServerErrorKind::ReadOnly,
                message: "READONLY the master the sentinels named is a replica now".to_owned(),
            };
            self.fail(id, why, now);
            self.io.push_back(Io::Close(id));
        }
        if down {
            // The cluster is electing a master, or lost a slot's: read again soon.
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
        if cluster {
            self.hand_off_unmapped(i, now);
        }
        self.confirm_if_idle(i, now);
        if cluster {
            self.refresh_if_due(member, now);
        }
    }

    /// Routes every message read on node `i`'s pub/sub connection to the callers of its
    /// channel; on a cluster member, what a message asks of the channel's routing is done.
    pub(super) fn recv_pushes(&mut self, i: usize, now: Instant) {
        if let Some(c) = &mut self.closing {
            c.progress = now;
        }
        let limits = self.config.limits;
        let member = self.nodes[i].member;
        let mut pushes = Vec::new();
        let channels = &mut self.channels;
        let mail = &mut self.mail;
        let result = self.nodes[i].sub.take_replies(&limits, |_, bytes, _, _| {
            match channels.handle_push(i, member, bytes, &limits, mail) {
                Push::Nothing => {}
                push => pushes.push(push),
            }
        });
        let id = ConnId { node: i, sub: true };
        match result {
            Ok(false) => {}
            Ok(true) => {
                self.nodes[i].sub.release_held();
                self.touch(id);
            }
            Err(why) => {
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
            }
        }
        for push in pushes {
            self.handle_sharded_push(i, push, now);
        }
    }
}

/// The reply to a `WAIT` or a `WAITAOF` read on a node of member `member`.
struct Waited<'a> {
    bytes: &'a [u8],
    /// [`Slot::Wait`] or [`Slot::WaitAof`].
    slot: Slot,
    /// Another wait answers next (a `WAITAOF` after this `WAIT`).
    more: bool,
    wants: (u32, Option<(u32, u32)>),
    member: usize,
    now: Instant,
}

/// What a wait's reply `w` does to the reply held behind it (`awaiting`): it waits for the
/// next wait, or counts (its owner gets it), or falls short (its owner gets the failure, never
/// a vote; a compare-and-delete stays owed, into `unacked`). The cleanups its connection ran
/// before it without a wait of their own (`unconfirmed`) are confirmed if it said enough, and
/// kept if not. Returns how many replies read were no progress: the wait's own if nothing
/// waited for it (its command was refused, or redirected, or it is the endpoint's own for
/// the cleanups), or every one read for a compare-and-delete that stays owed.
#[allow(clippy::too_many_arguments)]
fn answer_wait(
    awaiting: &mut Option<Awaiting>,
    w: Waited<'_>,
    limits: &crate::resp::Limits,
    stats: &Recorder,
    mail: &mut Mail,
    unacked: &mut Vec<Refusal>,
    again_backoff: &mut Duration,
    unconfirmed: &mut Unconfirmed,
) -> u64 {
    let verdict = waited(w.bytes, w.wants, w.slot, limits);
    // It answers for every earlier write of its connection: the cleanups kept too.
    let first = w.slot == Slot::Wait || w.wants.0 == 0;
    unconfirmed.waited(first, verdict.is_ok(), w.more, w.now);
    let Some(mut a) = awaiting.take() else {
        return 1;
    };
    if verdict.is_ok() && w.more {
        a.reads += 1;
        *awaiting = Some(a);
        return 0;
    }
    if let Slot::Reply {
        caller,
        run,
        tag,
        sent,
        ..
    } = a.slot
    {
        stats.reply(w.member, w.now.saturating_duration_since(sent));
        match &verdict {
            Ok(()) => mail.post_reply(caller as usize, run, w.member, tag, &a.reply),
            Err(why) => mail.post(
                caller as usize,
                run,
                Event::Failure {
                    node: w.member,
                    tag,
                    why: why.clone(),
                },
            ),
        }
    }
    match (verdict, a.slot.redo()) {
        (Ok(()), Some(_)) => {
            *again_backoff = BACKOFF_MIN;
            0
        }
        (Err(_), Some(redo)) => {
            // Nobody waits for it any more: its owner heard the failure.
            unacked.push(Refusal {
                slot: Slot::Discard {
                    redo: Some(redo),
                    given: None,
                },
                kind: Refused::Unacknowledged,
                command: a.command,
                before: redo.before as usize,
                reply: Vec::new(),
            });
            a.reads + 1
        }
        _ => 0,
    }
}

/// What the reply to a `WAIT` or a `WAITAOF` after a grant (`slot`, [`Slot::Wait`] or
/// [`Slot::WaitAof`]) says of the grant: it counts only if at least as many replicas as
/// `wants` asks (`?wait=N`, then `?waitaof=L,R`: the master's own fsync and the replicas')
/// acknowledged it; fewer, or an error (`NOREPLICAS`, a refusal, `WAITAOF` on a server
/// without an append-only file or too old for it), is a failure of the node for it, never a
/// vote.
pub(super) fn waited(
    bytes: &[u8],
    wants: (u32, Option<(u32, u32)>),
    slot: Slot,
    limits: &crate::resp::Limits,
) -> Result<(), NodeErrorKind> {
    let answer = cluster::decode(bytes, limits);
    let failed = |message: String| {
        Err(NodeErrorKind::Server {
            kind: crate::resp::ServerErrorKind::Other,
            message,
        })
    };
    if slot == Slot::WaitAof {
        let (local, replicas) = wants.1.unwrap_or((0, 0));
        let counts = match &answer {
            Some(Reply::Array(Some(items))) => match items.as_slice() {
                [Reply::Integer(l), Reply::Integer(r)] => Some((*l, *r)),
                _ => None,
            },
            _ => None,
        };
        return match (counts, answer) {
            (Some((l, r)), _) if l >= i64::from(local) && r >= i64::from(replicas) => Ok(()),
            (Some((l, r)), _) => failed(format!(
                "NOREPLICAS WAITAOF {local} {replicas}: the write was fsynced locally {l} \
                 and by {r} replicas within the node timeout"
            )),
            (None, Some(Reply::Error(e))) => failed(format!(
                "WAITAOF {local} {replicas} refused: {}",
                String::from_utf8_lossy(e)
            )),
            (None, _) => failed(format!(
                "WAITAOF {local} {replicas}: an unexpected reply, not [local, replicas]"
            )),
        };
    }
    let replicas = wants.0;
    match answer {
        Some(Reply::Integer(n)) if n >= i64::from(replicas) => Ok(()),
        answer => {
            let reached = match answer {
                Some(Reply::Integer(n)) => n.to_string(),
                _ => "none".to_owned(),
            };
            failed(format!(
                "NOREPLICAS the write reached {reached} of the {replicas} replicas WAIT \
                 asked for within the node timeout"
            ))
        }
    }
}
