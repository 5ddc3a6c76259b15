//! Quorum members that are masters managed by Redis Sentinel (`redis+sentinel://`).
//!
//! Such a member is one node, whose address is the master its sentinels name for its service.
//! A *sentinel link* (a node of its own, past the members and owning no lock command) asks them
//! in turn, `SENTINEL get-master-addr-by-name SERVICE`, with the sentinels' credentials: a
//! sentinel that cannot be reached, refuses the credentials, does not know the service or does
//! not answer within the node timeout moves the question on to the next one. Until a master is
//! named, nothing is sent to the member: its commands fail at once, as on a node that is down,
//! and its compare-and-deletes are kept for its next connection.
//!
//! Every connection to the master checks `ROLE` in its setup, before anything it carries can
//! count: a server that says it is a replica fails the connection, and the sentinels are asked
//! again. So does any failure of the member's connection (a broken or refused connect, a
//! refused setup) and a `READONLY` reply (a master demoted under the connection); a
//! compare-and-delete refused with `READONLY` is kept, as one of a broken connection. When the
//! sentinels name another master, the connection to the old one is failed: what it owed
//! (releases, cleanups) goes, first thing, to the new one, exactly as after a broken
//! connection. The same-server check (`run_id`) applies to the master as to any node.
//!
//! When every sentinel of a round that could be reached (one at least) refused the credentials
//! or did not know the service, the member's URL is wrong: [`Endpoint::setup_failures`] reports it (the client's build fails
//! with `Error::Config`). Rounds that find nothing are tried again with a backoff.
//!
//! A failure says what failed. Without a master, the member's commands fail with a
//! `MASTERDOWN no master for the service "…"` error saying why (no sentinel could be reached,
//! the sentinels do not know the service, none answered yet), naming the sentinels asked; a
//! failure of the master itself (a connect, `ROLE` saying replica, a broken connection) is
//! named by the master's address, the service and the sentinels (see `Config::failure`).
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::conn::{Conn, Slot, BACKOFF_MAX};
use super::{ConnId, Endpoint, Io, Node, GIVEN, UNSENT};
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply, ServerErrorKind};
use crate::url::NodeAddr;

/// The least wait before a round that follows another one (a failure seen during a round asks
/// for another): a master that fails every connect is not worth a question every millisecond.
const ROUND_GAP: Duration = Duration::from_millis(50);

/// What one Sentinel member knows of its sentinels and its master.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The node that asks the sentinels.
    pub link: usize,
    /// The sentinel asked last (the next round starts with it: it answered last time).
    at: usize,
    /// The sentinel the link's connection is to, while it is open.
    connected_to: Option<usize>,
    /// A round is under way since then.
    asking: Option<Instant>,
    /// How many sentinels failed in the round under way; whether every one that was reached
    /// failed for a configuration error (credentials refused, service unknown), with the last
    /// such error.
    failed: usize,
    all_config: bool,
    last_config: Option<NodeErrorKind>,
    /// How many sentinels of the round under way could not be reached, and the last failure
    /// of one that could (for the wording of [`Endpoint::without_master`]).
    unreachable: usize,
    last_other: Option<NodeErrorKind>,
    /// Why the last round that ended found no master (`None`: none ended so).
    nothing: Option<String>,
    /// Something happened during the round under way that calls for another one.
    again: bool,
    /// The master the sentinel at `at` named failed (a connect refused, `ROLE` said replica,
    /// a broken connection): the next round starts with the next sentinel, not the same one
    /// forever (one cut off from the others may keep naming a dead master, or a replica).
    skip: bool,
    /// When the next round starts, while none is under way.
    next: Option<Instant>,
    /// The wait before the next round after one that found no master.
    backoff: Duration,
    /// The member's URL is wrong: every sentinel of the last round said so.
    pub config_error: Option<NodeErrorKind>,
    /// The master last named.
    master: Option<SocketAddr>,
    /// The sentinel whose `+switch-master` messages the link's pub/sub connection hears,
    /// while it is open.
    subscribed_to: Option<usize>,
    /// The master a sentinel named by a host name, while the shell resolves it (see
    /// [`Io::Resolve`]): from an answer (with the sentinel that gave it), and from a
    /// `+switch-master` message.
    answer_name: Option<(String, u16, usize)>,
    switch_name: Option<(String, u16)>,
}

impl Watch {
    fn new(link: usize, now: Instant) -> Watch {
        Watch {
            link,
            at: 0,
            connected_to: None,
            asking: None,
            failed: 0,
            all_config: true,
            last_config: None,
            unreachable: 0,
            last_other: None,
            nothing: None,
            again: false,
            skip: false,
            next: Some(now),
            backoff: ROUND_GAP,
            config_error: None,
            master: None,
            subscribed_to: None,
            answer_name: None,
            switch_name: None,
        }
    }

    /// When something is due: the next round, or the end of the question under way.
    pub fn due(&self, limit: Duration) -> Option<Instant> {
        match self.asking {
            Some(since) => Some(since + limit),
            None => self.next,
        }
    }
}

/// Whether a failure of a sentinel says the member's URL is wrong rather than that sentinel
/// down: its credentials refused, or the service unknown to it.
fn is_config(why: &NodeErrorKind) -> bool {
    matches!(why, NodeErrorKind::Setup { .. })
}

/// The sentinels of `spec`, as `a, b, c`.
fn listed(spec: &crate::url::SentinelSpec) -> String {
    let all: Vec<&str> = spec.sentinels.iter().map(|s| s.display.as_str()).collect();
    all.join(", ")
}

/// Whether a failure of a sentinel says nothing of the URL: it could not be reached.
fn is_unreachable(why: &NodeErrorKind) -> bool {
    matches!(why, NodeErrorKind::Connect(_) | NodeErrorKind::Timeout)
}

/// The node of a new sentinel link of `member`, to the first of `node`'s sentinels.
pub(super) fn link_node(member: usize, node: &NodeAddr, now: Instant) -> Option<Node> {
    let spec = node.sentinel.as_ref()?;
    Some(Node {
        member,
        addr: Some(Box::new(spec.sentinels[0].clone())),
        kept: Default::default(),
        awaiting: None,
        // Not a data node: its setup is `AUTH` alone, if the sentinels have credentials.
        cmd: Conn::new(false, now),
        sub: Conn::new(false, now),
        server: Default::default(),
        known: false,
        retries: Vec::new(),
        retry_bytes: Vec::new(),
        again_at: None,
        again_backoff: super::BACKOFF_MIN,
        unsent: [None; UNSENT],
        unsent_next: 0,
        unconfirmed: Default::default(),
        unwaited: false,
        given: [None; GIVEN],
        given_next: 0,
    })
}

pub(super) fn new_watch(link: usize, now: Instant) -> Watch {
    Watch::new(link, now)
}

/// The master a reply to `SENTINEL get-master-addr-by-name` names: `Ok(None)` when the
/// sentinel does not know the service, `Err` for a reply no sentinel gives.
fn parse_master(bytes: &[u8], limits: &resp::Limits) -> Result<Option<Named>, NodeErrorKind> {
    let Some(reply) = super::cluster::decode(bytes, limits) else {
        return Err(NodeErrorKind::UnexpectedReply);
    };
    match reply {
        Reply::Array(None) | Reply::Bulk(None) => Ok(None),
        Reply::Array(Some(items)) => {
            let (Some(Reply::Bulk(Some(host))), Some(Reply::Bulk(Some(port)))) =
                (items.first(), items.get(1))
            else {
                return Err(NodeErrorKind::UnexpectedReply);
            };
            let host = std::str::from_utf8(host).map_err(|_| NodeErrorKind::UnexpectedReply)?;
            let port = std::str::from_utf8(port)
                .ok()
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|&p| p != 0)
                .ok_or(NodeErrorKind::UnexpectedReply)?;
            Ok(Some(named(host, port)))
        }
        // Sentinels that want credentials the URL does not give, or a user not allowed to ask.
        Reply::Error(m)
            if matches!(
                ServerErrorKind::of(m),
                ServerErrorKind::NoAuth | ServerErrorKind::WrongPass | ServerErrorKind::NoPerm
            ) || m.starts_with(b"DENIED") =>
        {
            Err(NodeErrorKind::Setup {
                command: "SENTINEL get-master-addr-by-name",
                cause: Box::new(crate::engine::ops::server_error(m)),
            })
        }
        Reply::Error(m) => Err(crate::engine::ops::server_error(m)),
        _ => Err(NodeErrorKind::UnexpectedReply),
    }
}

/// A master as a sentinel names it, by `host` and `port`.
#[derive(Debug)]
enum Named {
    /// An address, the host as it was given.
    Addr(SocketAddr, String),
    /// A host name: the shell resolves it (see [`Io::Resolve`]).
    Name(String, u16),
}

/// The master a sentinel names as `host` and `port`, in an answer or in a `+switch-master`
/// message alike. Sentinels announce addresses unless told to announce names
/// (`resolve-hostnames`): a name is left for the shell to resolve, once per answer or message
/// (the endpoint makes no system call).
fn named(host: &str, port: u16) -> Named {
    match host.parse::<IpAddr>() {
        Ok(ip) => Named::Addr(SocketAddr::new(ip, port), host.to_owned()),
        Err(_) => Named::Name(host.to_owned(), port),
    }
}

/// The new master a `+switch-master` message names for `service`: its payload is
/// `name old-ip old-port new-ip new-port`.
fn parse_switch(bytes: &[u8], service: &[u8], limits: &resp::Limits) -> Option<Named> {
    let Some(Reply::Array(Some(items))) = super::cluster::decode(bytes, limits) else {
        return None;
    };
    let [Reply::Bulk(Some(kind)), Reply::Bulk(Some(b"+switch-master")), Reply::Bulk(Some(payload))] =
        &items[..]
    else {
        return None;
    };
    if *kind != b"message" {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    if words.next()?.as_bytes() != service {
        return None;
    }
    let (_, _, host, port) = (words.next()?, words.next()?, words.next()?, words.next()?);
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    Some(named(host, port))
}

impl Endpoint {
    /// Whether node `i` is the sentinel link of a Sentinel member.
    pub(super) fn is_sentinel_link(&self, i: usize) -> bool {
        i >= self.members
            && self.sentinels[self.nodes[i].member]
                .as_ref()
                .is_some_and(|w| w.link == i)
    }

    /// Takes the masters `other` (an endpoint over the same members, in the parent of a
    /// forked child) was using for its Sentinel members: the child's first commands go there
    /// rather than fail until its own sentinels answer. Its connections check `ROLE` in their
    /// setup as any does, and its sentinels are asked all the same.
    pub(super) fn adopt_masters(&mut self, other: &Endpoint) {
        for member in 0..self.members.min(other.members) {
            let theirs = other.sentinels.get(member).and_then(Option::as_ref);
            let (Some(w), Some(master)) = (self.sentinels[member].as_mut(), theirs) else {
                continue;
            };
            if let (Some(addr), Some(node)) = (master.master, &other.nodes[member].addr) {
                w.master = Some(addr);
                self.nodes[member].addr = Some(node.clone());
            }
        }
    }

    /// The connections to read before a caller's commands go out (by [`ConnId::index`]), into
    /// `into` (emptied first): the open `+switch-master` subscriptions. A message that came
    /// while nobody read (the client idle) names the master the next commands must go to;
    /// read after they went out, they would have gone to the old one.
    pub fn read_first(&self, into: &mut super::Bits) {
        into.clear();
        for w in self.sentinels.iter().flatten() {
            let id = ConnId {
                node: w.link,
                sub: true,
            };
            if self.nodes[w.link].sub.is_up() {
                into.insert(id.index());
            }
        }
    }

    /// Whether a Sentinel member has no master named yet, or a round of its sentinels is
    /// under way: someone must drive the endpoint (its timers, and reading the answers).
    pub(super) fn sentinels_pending(&self) -> bool {
        self.sentinels.iter().enumerate().any(|(member, w)| {
            w.as_ref()
                .is_some_and(|w| w.asking.is_some() || self.nodes[member].addr.is_none())
        })
    }

    /// Why nothing can go to node `i` now, when it is a Sentinel member whose sentinels have
    /// not named a master yet (or a sentinel link, which takes no lock command).
    pub(super) fn without_master(&self, i: usize) -> Option<NodeErrorKind> {
        let watch = self.sentinels.get(self.nodes[i].member)?.as_ref()?;
        if i == watch.link || (i < self.members && self.nodes[i].addr.is_none()) {
            if let Some(e) = &watch.config_error {
                return Some(e.clone());
            }
            let spec = self.config.nodes[self.nodes[i].member].sentinel.as_ref()?;
            let why = match &watch.nothing {
                Some(why) => why.clone(),
                None => format!(
                    "the sentinels have not named one yet (asking {})",
                    listed(spec)
                ),
            };
            return Some(NodeErrorKind::Server {
                kind: ServerErrorKind::MasterDown,
                message: format!("{}{:?}: {why}", crate::error::NO_MASTER, spec.service),
            });
        }
        None
    }

    /// How long one sentinel has to answer a round's question.
    fn sentinel_limit(&self) -> Duration {
        self.config.node_timeout.max(self.config.connect_timeout)
    }

    /// When the sentinels of some member are next due to be asked, or a question times out.
    pub(super) fn sentinels_due(&self) -> Option<Instant> {
        let limit = self.sentinel_limit();
        self.sentinels
            .iter()
            .flatten()
            .filter_map(|w| w.due(limit))
            .min()
    }

    /// Starts a round of member `member`'s sentinels if one is due, and gives up on a sentinel
    /// that did not answer in time.
    pub(super) fn sentinels_if_due(&mut self, member: usize, now: Instant) {
        let limit = self.sentinel_limit();
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        match w.asking {
            Some(since) if since + limit <= now => {
                let link = w.link;
                let id = ConnId {
                    node: link,
                    sub: false,
                };
                if self.is_open(id) {
                    self.io.push_back(Io::Close(id));
                }
                self.sentinel_failed(link, NodeErrorKind::Timeout, now);
            }
            Some(_) => {}
            None if w.next.is_some_and(|t| t <= now) => {
                if std::mem::take(&mut w.skip) {
                    let count = self.config.nodes[member]
                        .sentinel
                        .as_ref()
                        .map_or(1, |s| s.sentinels.len());
                    w.at = (w.at + 1) % count;
                }
                w.next = None;
                w.asking = Some(now);
                w.failed = 0;
                w.all_config = true;
                w.last_config = None;
                w.unreachable = 0;
                w.last_other = None;
                w.again = false;
                self.ask_sentinel(member, now);
            }
            None => {}
        }
    }

    /// Something about member `member`'s master is wrong (its connection failed, it refused a
    /// write as a replica, it said it is one): its sentinels are asked again, from the one
    /// after the sentinel that named it.
    pub(super) fn suspect_master(&mut self, member: usize, now: Instant) {
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        w.skip = true;
        if w.asking.is_some() {
            w.again = true;
        } else {
            let soon = now + ROUND_GAP.min(w.backoff);
            w.next = Some(w.next.map_or(soon, |t| t.min(soon)).max(now));
        }
    }

    /// Asks the sentinel the round is at: on the link's connection if it is open to that
    /// sentinel, else on a new one.
    fn ask_sentinel(&mut self, member: usize, now: Instant) {
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        let link = w.link;
        let at = w.at;
        let reuse = w.connected_to == Some(at) && !self.nodes[link].cmd.is_down();
        let Some(spec) = self.config.nodes[member].sentinel.as_ref() else {
            return;
        };
        let id = ConnId {
            node: link,
            sub: false,
        };
        if !reuse {
            if !self.nodes[link].cmd.is_down() {
                self.io.push_back(Io::Close(id));
            }
            let node = &mut self.nodes[link];
            node.addr = Some(Box::new(spec.sentinels[at].clone()));
            node.cmd = Conn::new(false, now);
            node.cmd.start(&spec.sentinels[at], false, now);
            self.io.push_back(Io::Connect(id));
            if let Some(w) = self.sentinels[member].as_mut() {
                w.connected_to = Some(at);
            }
        }
        let service = spec.service.as_bytes();
        self.nodes[link].cmd.queue(Slot::Sentinel, None, |out| {
            resp::encode_command(out, &[b"SENTINEL", b"get-master-addr-by-name", service]);
            0
        });
        self.touch(id);
    }

    /// The sentinel link `link`'s connection failed, or its sentinel could not answer the
    /// question: the round moves on to the next sentinel, or ends when each has failed.
    pub(super) fn sentinel_failed(&mut self, link: usize, why: NodeErrorKind, now: Instant) {
        let member = self.nodes[link].member;
        if !self.nodes[link].cmd.is_down() {
            self.nodes[link].cmd.fail(why.clone(), now, |_, _| {});
        }
        let (count, asked) = self.config.nodes[member]
            .sentinel
            .as_ref()
            .map_or((1, String::new()), |s| (s.sentinels.len(), listed(s)));
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        w.connected_to = None;
        if w.asking.is_none() {
            // An idle connection closed: the next round opens another.
            return;
        }
        w.failed += 1;
        if is_config(&why) {
            w.last_config = Some(why);
        } else if is_unreachable(&why) {
            w.unreachable += 1;
        } else {
            w.all_config = false;
            w.last_other = Some(why);
        }
        w.at = (w.at + 1) % count;
        if w.failed < count {
            w.asking = Some(now);
            return self.ask_sentinel(member, now);
        }
        // Every sentinel failed.
        w.asking = None;
        w.nothing = Some(if w.unreachable == count {
            format!("no sentinel could be reached (tried {asked})")
        } else if let Some(NodeErrorKind::Setup { cause, .. }) = &w.last_config {
            format!("{cause} (asked {asked})")
        } else if let Some(other) = &w.last_other {
            format!("no sentinel named one (asked {asked}; the last said: {other})")
        } else {
            format!("no sentinel named one (asked {asked})")
        });
        if w.all_config {
            // Each sentinel reached (one at least) refused the credentials or did not know
            // the service: the URL is wrong. The error names the sentinels asked.
            w.config_error = w.last_config.take().map(|e| match e {
                NodeErrorKind::Setup { command, cause } => NodeErrorKind::Setup {
                    command,
                    cause: Box::new(match *cause {
                        NodeErrorKind::Server { kind, message } => NodeErrorKind::Server {
                            kind,
                            message: format!("{message} (asked {asked})"),
                        },
                        other => other,
                    }),
                },
                other => other,
            });
        }
        w.next = Some(now + w.backoff);
        w.backoff = (w.backoff * 2).min(BACKOFF_MAX);
    }

    /// Replies read on sentinel link `link`.
    pub(super) fn sentinel_recv(&mut self, link: usize, now: Instant) {
        let limits = self.config.limits;
        let mut answers: Vec<Result<Option<Named>, NodeErrorKind>> = Vec::new();
        let result = self.nodes[link]
            .cmd
            .take_replies(&limits, |slot, bytes, _, _| {
                if slot == Slot::Sentinel {
                    answers.push(parse_master(bytes, &limits));
                }
            });
        let id = ConnId {
            node: link,
            sub: false,
        };
        match result {
            Ok(false) => {}
            Ok(true) => {
                self.nodes[link].cmd.release_held();
                self.touch(id);
            }
            Err(why) => {
                self.io.push_back(Io::Close(id));
                return self.sentinel_failed(link, why, now);
            }
        }
        let member = self.nodes[link].member;
        for answer in answers {
            match answer {
                Ok(Some(Named::Addr(addr, host))) => self.master_named(member, addr, &host, now),
                Ok(Some(Named::Name(host, port))) => {
                    if let Some(w) = self.sentinels[member].as_mut() {
                        w.answer_name = Some((host, port, w.at));
                        self.io.push_back(Io::Resolve {
                            member,
                            switch: false,
                        });
                    }
                }
                Ok(None) => {
                    let service = self.config.nodes[member]
                        .sentinel
                        .as_ref()
                        .map_or("", |s| s.service.as_str());
                    let why = NodeErrorKind::Setup {
                        command: "SENTINEL get-master-addr-by-name",
                        cause: Box::new(NodeErrorKind::Server {
                            kind: ServerErrorKind::Other,
                            message: format!("the sentinel does not know the service {service:?}"),
                        }),
                    };
                    // The connection is good; the question goes to the next sentinel.
                    if self.sentinels[member]
                        .as_ref()
                        .is_some_and(|w| w.asking.is_some())
                    {
                        self.sentinel_refused(link, why, now);
                    }
                }
                Err(why) => {
                    self.io.push_back(Io::Close(id));
                    return self.sentinel_failed(link, why, now);
                }
            }
        }
    }

    /// [`sentinel_failed`](Self::sentinel_failed) for a sentinel that answered without naming
    /// a master: its connection is closed, and the question goes to the next sentinel.
    fn sentinel_refused(&mut self, link: usize, why: NodeErrorKind, now: Instant) {
        let id = ConnId {
            node: link,
            sub: false,
        };
        if self.is_open(id) {
            self.io.push_back(Io::Close(id));
        }
        self.nodes[link]
            .cmd
            .fail(NodeErrorKind::Timeout, now, |_, _| {});
        self.sentinel_failed(link, why, now);
    }

    /// A sentinel of member `member` named the master at `addr` (`host` as it gave it): the
    /// round is over. A master other than the one in use takes the member's place: the
    /// connections to the old one are failed, what they owed goes to the new one.
    fn master_named(&mut self, member: usize, addr: SocketAddr, host: &str, now: Instant) {
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        if w.asking.is_none() {
            return;
        }
        w.asking = None;
        w.config_error = None;
        w.nothing = None;
        w.backoff = ROUND_GAP;
        if w.again {
            w.again = false;
            w.next = Some(now + ROUND_GAP);
        }
        let at = w.at;
        self.subscribe_switches(member, at, now);
        self.use_master(member, addr, host, now);
    }

    /// Member `member`'s master is the one at `addr` (`host` as the sentinels gave it). Another
    /// than the one in use takes its place: the connections to the old one are failed, and
    /// what they owed goes to the new one.
    fn use_master(&mut self, member: usize, addr: SocketAddr, host: &str, now: Instant) {
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        let moved = w.master != Some(addr);
        w.master = Some(addr);
        self.config.masters.set(member, addr);
        if !moved && self.nodes[member].addr.is_some() {
            return;
        }
        let master = self.config.nodes[member].sentinel_master(addr, host);
        for sub in [false, true] {
            let id = ConnId { node: member, sub };
            if self.is_open(id) {
                self.io.push_back(Io::Close(id));
                let why = NodeErrorKind::Server {
                    kind: ServerErrorKind::Other,
                    message: format!("the sentinels named another master, {addr}"),
                };
                self.fail(id, why, now);
            }
        }
        self.nodes[member].addr = Some(Box::new(master));
        self.nodes[member].cmd.retry_now(now);
        self.nodes[member].sub.retry_now(now);
        self.connect_if_down(member, now);
    }

    /// Has the sentinel link of `member` hear `+switch-master` from sentinel `at`, the one
    /// that just answered, unless its pub/sub connection hears another one already.
    fn subscribe_switches(&mut self, member: usize, at: usize, now: Instant) {
        let Some(w) = self.sentinels[member].as_mut() else {
            return;
        };
        let link = w.link;
        let id = ConnId {
            node: link,
            sub: true,
        };
        if w.subscribed_to.is_some() && !self.nodes[link].sub.is_down() {
            return;
        }
        w.subscribed_to = Some(at);
        let Some(spec) = self.config.nodes[member].sentinel.as_ref() else {
            return;
        };
        if !self.nodes[link].sub.is_down() {
            self.io.push_back(Io::Close(id));
        }
        let sub = &mut self.nodes[link].sub;
        *sub = Conn::new(false, now);
        sub.start(&spec.sentinels[at], false, now);
        sub.queue_unmatched(|out| {
            resp::encode_command(out, &[b"SUBSCRIBE", b"+switch-master"]);
        });
        self.io.push_back(Io::Connect(id));
        self.touch(id);
    }

    /// The sentinel link `link`'s pub/sub connection failed: the next round subscribes again.
    pub(super) fn sentinel_sub_failed(&mut self, link: usize, why: NodeErrorKind, now: Instant) {
        self.nodes[link].sub.fail(why, now, |_, _| {});
        let member = self.nodes[link].member;
        if let Some(w) = self.sentinels[member].as_mut() {
            w.subscribed_to = None;
            if w.asking.is_none() {
                let later = now + BACKOFF_MAX;
                w.next = Some(w.next.map_or(later, |t| t.min(later)));
            }
        }
    }

    /// Messages read on sentinel link `link`'s pub/sub connection: a `+switch-master` of the
    /// member's service names its new master.
    pub(super) fn sentinel_push(&mut self, link: usize, now: Instant) {
        let limits = self.config.limits;
        let member = self.nodes[link].member;
        let Some(spec) = self.config.nodes[member].sentinel.as_ref() else {
            return;
        };
        let service = spec.service.as_bytes();
        let mut switched: Option<Named> = None;
        let result = self.nodes[link]
            .sub
            .take_replies(&limits, |_, bytes, _, _| {
                if let Some(new) = parse_switch(bytes, service, &limits) {
                    switched = Some(new);
                }
            });
        let id = ConnId {
            node: link,
            sub: true,
        };
        match result {
            Ok(false) => {}
            Ok(true) => {
                self.nodes[link].sub.release_held();
                self.touch(id);
            }
            Err(why) => {
                self.io.push_back(Io::Close(id));
                return self.sentinel_sub_failed(link, why, now);
            }
        }
        match switched {
            Some(Named::Addr(addr, host)) => self.use_master(member, addr, &host, now),
            Some(Named::Name(host, port)) => {
                if let Some(w) = self.sentinels[member].as_mut() {
                    w.switch_name = Some((host, port));
                    self.io.push_back(Io::Resolve {
                        member,
                        switch: true,
                    });
                }
            }
            None => {}
        }
    }

    /// The host name and port that [`Io::Resolve`] asks the shell to resolve, while it is
    /// still wanted.
    pub fn name_to_resolve(&self, member: usize, switch: bool) -> Option<(&str, u16)> {
        let w = self.sentinels.get(member)?.as_ref()?;
        match switch {
            false => w.answer_name.as_ref().map(|(h, p, _)| (h.as_str(), *p)),
            true => w.switch_name.as_ref().map(|(h, p)| (h.as_str(), *p)),
        }
    }

    /// The shell resolved the name of [`Io::Resolve`] to `addr` (`None`: it could not). A
    /// sentinel's answer then names that master, or, unresolvable, fails that sentinel as an
    /// answer no sentinel gives; a `+switch-master` message moves the member to it, or is let
    /// go.
    pub fn handle_resolved(
        &mut self,
        member: usize,
        switch: bool,
        addr: Option<SocketAddr>,
        now: Instant,
    ) {
        let Some(w) = self.sentinels.get_mut(member).and_then(Option::as_mut) else {
            return;
        };
        if switch {
            if let (Some((host, _)), Some(addr)) = (w.switch_name.take(), addr) {
                self.use_master(member, addr, &host, now);
            }
            return;
        }
        let Some((host, _, at)) = w.answer_name.take() else {
            return;
        };
        // The sentinel that gave the name is no longer the one asked: the answer is stale.
        if w.connected_to != Some(at) {
            return;
        }
        let link = w.link;
        match addr {
            Some(addr) => self.master_named(member, addr, &host, now),
            None => {
                let id = ConnId {
                    node: link,
                    sub: false,
                };
                if self.is_open(id) {
                    self.io.push_back(Io::Close(id));
                }
                self.sentinel_failed(link, NodeErrorKind::UnexpectedReply, now);
            }
        }
    }
}

#[cfg(test)]
#[path = "sentinel_tests.rs"]
mod tests;
