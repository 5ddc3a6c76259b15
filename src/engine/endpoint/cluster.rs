//! What the endpoint knows of a quorum member that is a Redis Cluster: which master serves
//! each hash slot, and how a command, a topology reply and a redirection are read.
//!
//! A cluster member has one *seed link* (its own node index: a connection to the URL's seed
//! addresses, tried in turn) and one link per master in use, added as the topology names them.
//! Every link is a node of the endpoint with its own command connection, setup, backoff and
//! compare-and-deletes to send again, and its own subscriber connection: wake announcements
//! are published with `SPUBLISH` on a channel in the lock's slot, so a wake channel is
//! subscribed to (`SSUBSCRIBE`) on the master that owns its slot, and follows the slot.
//!
//! A command goes to the master of the slot of its first key (every key of one lock shares a
//! hash tag, so a command touches one slot). While no topology has been read, it goes to the
//! seed link, whose node redirects it if it does not serve the slot.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::bits::Bits;
use super::confirm::Unconfirmed;
use super::conn::{Conn, Redo, Slot, BACKOFF_MIN};
use super::setup::Server;
use super::{ConnId, Endpoint, Io, Node, Redirected, Retry, GIVEN, UNSENT};
use crate::engine::machine::{Machine, Transmit};
use crate::error::NodeErrorKind;
use crate::resp::{self, Limits, Reply, Status};
use crate::url::Target;

/// How many hash slots a Redis Cluster has.
pub(crate) const SLOTS: usize = 16384;
/// No link serves the slot.
const NONE: u32 = u32::MAX;
/// How often a cluster's topology is read again when nothing asks for it sooner.
pub(crate) const REFRESH_PERIOD: Duration = Duration::from_secs(10);
/// The shortest time between two topology reads of one cluster (a burst of `MOVED` replies,
/// or of broken connections, asks for one read).
pub(crate) const REFRESH_MIN_GAP: Duration = Duration::from_millis(100);
/// How long a topology read may go unanswered before another is sent.
pub(crate) const REFRESH_STALE: Duration = Duration::from_secs(1);
/// How many redirections one command follows before its owner is given the last one (an
/// error reply, a failure of that member for the round).
pub(crate) const MAX_HOPS: u8 = 5;

/// The CRC16 (XMODEM) of `bytes`, as Redis Cluster hashes keys.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`: the CRC16 of its hash tag (the bytes between its first `{` and the
/// first `}` after it, when there are any) or of the whole key, mod 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

/// Reads one RESP array of bulk strings (a command as the engine writes it) at the start of
/// `bytes`: its arguments, and the bytes it takes.
fn command(bytes: &[u8]) -> Option<(Vec<&[u8]>, usize)> {
    fn line(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&bytes[at + 1..end])
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    if bytes.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = line(bytes, 0)?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        if bytes.get(at) != Some(&b'$') {
            return None;
        }
        let (len, start) = line(bytes, at)?;
        args.push(bytes.get(start..start + len)?);
        at = start + len + 2;
    }
    Some((args, at))
}

/// The hash slot of the first key among the commands in `bytes` (a command, or a sequence
/// such as `MULTI` … `EXEC`), as the engine writes them; `None` when they name no key.
/// Channels are not keys here: an `SPUBLISH` goes with the command of the lock it announces.
pub(crate) fn first_key_slot(mut bytes: &[u8]) -> Option<u16> {
    while let Some((args, used)) = command(bytes) {
        bytes = &bytes[used..];
        let Some(name) = args.first() else { continue };
        let upper = name.to_ascii_uppercase();
        let key = match &upper[..] {
            b"MULTI" | b"EXEC" | b"DISCARD" | b"ASKING" | b"PUBLISH" | b"SUBSCRIBE"
            | b"UNSUBSCRIBE" | b"INFO" | b"SCRIPT" | b"CLUSTER" | b"COMMAND" => None,
            b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
                let keys = std::str::from_utf8(args.get(2)?)
                    .ok()?
                    .parse::<usize>()
                    .ok()?;
                (keys > 0).then(|| args.get(3).copied()).flatten()
            }
            _ => args.get(1).copied(),
        };
        if let Some(key) = key {
            return Some(key_slot(key));
        }
    }
    None
}

/// A redirection a cluster node answered a command with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Redirect {
    /// `ASK` (this command only, after `ASKING`), not `MOVED` (the slot's new owner).
    pub ask: bool,
    pub slot: u16,
    /// Where to; `None` for an address a client cannot connect to (a name, an unknown
    /// endpoint).
    pub to: Option<SocketAddr>,
}

/// Reads `-MOVED slot host:port` and `-ASK slot host:port` (framed, with its CRLF). An empty
/// host is the node that answered (`from`).
pub(crate) fn redirect(reply: &[u8], from: Option<SocketAddr>) -> Option<Redirect> {
    let text = reply.strip_prefix(b"-")?;
    let text = text.strip_suffix(b"\r\n").unwrap_or(text);
    let text = std::str::from_utf8(text).ok()?;
    let mut words = text.split(' ');
    let ask = match words.next()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let slot = words
        .next()?
        .parse::<u16>()
        .ok()
        .filter(|&s| (s as usize) < SLOTS)?;
    let to = words.next().and_then(|a| address(a, from));
    Some(Redirect { ask, slot, to })
}

/// `host:port` as a cluster names a node (an IPv6 address without brackets); an empty host is
/// `from`'s.
fn address(text: &str, from: Option<SocketAddr>) -> Option<SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = if host.is_empty() {
        from?.ip()
    } else {
        host.parse::<IpAddr>().ok()?
    };
    Some(SocketAddr::new(ip, port))
}

/// One range of slots and the address of the master that serves it.
pub(crate) type Range = (u16, u16, SocketAddr);

/// Reads a `CLUSTER SHARDS` reply: for each shard, its slot ranges and its master that is
/// online (`tls` picks `tls-port` where the master has one; an empty IP is the node that
/// answered, `from`). A shard without such a master
/// serves none of its slots (`None` in the ranges' place is simply no range). `None` for a
/// reply that is not one.
pub(crate) fn parse_shards(
    reply: &Reply<'_>,
    tls: bool,
    from: Option<SocketAddr>,
) -> Option<Vec<Range>> {
    let Reply::Array(Some(shards)) = reply else {
        return None;
    };
    let mut out = Vec::new();
    for shard in shards {
        let Reply::Array(Some(fields)) = shard else {
            return None;
        };
        let (slots, nodes) = shard_fields(fields);
        let Some((master, _)) = nodes.iter().find_map(|n| shard_master(n, tls, from)) else {
            continue;
        };
        for range in slots.chunks(2) {
            if let [Reply::Integer(a), Reply::Integer(b)] = range {
                if let (Ok(a), Ok(b)) = (u16::try_from(*a), u16::try_from(*b)) {
                    if a <= b && (b as usize) < SLOTS {
                        out.push((a, b, master));
                    }
                }
            }
        }
    }
    Some(out)
}

/// A shard's slot ranges and nodes, from its fields in a `CLUSTER SHARDS` reply.
fn shard_fields<'r, 'a>(fields: &'r [Reply<'a>]) -> (&'r [Reply<'a>], &'r [Reply<'a>]) {
    let mut slots: &[Reply<'_>] = &[];
    let mut nodes: &[Reply<'_>] = &[];
    for pair in fields.chunks(2) {
        match pair {
            [Reply::Bulk(Some(b"slots")), Reply::Array(Some(s))] => slots = s,
            [Reply::Bulk(Some(b"nodes")), Reply::Array(Some(n))] => nodes = n,
            _ => {}
        }
    }
    (slots, nodes)
}

/// A node of a `CLUSTER SHARDS` reply, if it is an online master: its address (see
/// [`parse_shards`]), and its `hostname` when the cluster announces one.
fn shard_master<'a>(
    node: &Reply<'a>,
    tls: bool,
    from: Option<SocketAddr>,
) -> Option<(SocketAddr, Option<&'a [u8]>)> {
    let Reply::Array(Some(f)) = node else {
        return None;
    };
    let mut role = None;
    let mut health = None;
    let mut ip = None;
    let mut hostname = None;
    let mut port = None;
    let mut tls_port = None;
    for pair in f.chunks(2) {
        match pair {
            [Reply::Bulk(Some(b"role")), Reply::Bulk(Some(v))] => role = Some(*v),
            [Reply::Bulk(Some(b"health")), Reply::Bulk(Some(v))] => health = Some(*v),
            [Reply::Bulk(Some(b"ip")), Reply::Bulk(Some(v))] => ip = Some(*v),
            [Reply::Bulk(Some(b"hostname")), Reply::Bulk(Some(v))] if !v.is_empty() => {
                hostname = Some(*v)
            }
            [Reply::Bulk(Some(b"port")), Reply::Integer(p)] => port = Some(*p),
            [Reply::Bulk(Some(b"tls-port")), Reply::Integer(p)] => tls_port = Some(*p),
            _ => {}
        }
    }
    if role != Some(b"master") || health.is_some_and(|h| h != b"online") {
        return None;
    }
    let port = if tls { tls_port.or(port) } else { port }?;
    let ip = std::str::from_utf8(ip?).ok()?;
    Some((address(&format!("{ip}:{port}"), from)?, hostname))
}

/// The hostnames a `CLUSTER SHARDS` reply announces for its online masters (those with one
/// set: `cluster-announce-hostname`), by address: what TLS checks each master's certificate
/// against, as cluster clients do (a master without one is checked against its IP).
pub(crate) fn shard_hostnames(
    reply: &Reply<'_>,
    tls: bool,
    from: Option<SocketAddr>,
) -> Vec<(SocketAddr, String)> {
    let Reply::Array(Some(shards)) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for shard in shards {
        let Reply::Array(Some(fields)) = shard else {
            continue;
        };
        let (_, nodes) = shard_fields(fields);
        for node in nodes {
            if let Some((addr, Some(name))) = shard_master(node, tls, from) {
                if let Ok(name) = std::str::from_utf8(name) {
                    out.push((addr, name.to_owned()));
                }
            }
        }
    }
    out
}

/// Reads a `CLUSTER SLOTS` reply: for each range, its master (the first node listed). An
/// empty address is the node that answered (`from`).
pub(crate) fn parse_slots(reply: &Reply<'_>, from: Option<SocketAddr>) -> Option<Vec<Range>> {
    let Reply::Array(Some(ranges)) = reply else {
        return None;
    };
    let mut out = Vec::new();
    for range in ranges {
        let Reply::Array(Some(f)) = range else {
            return None;
        };
        let (Some(Reply::Integer(a)), Some(Reply::Integer(b)), Some(Reply::Array(Some(m)))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return None;
        };
        let (Some(Reply::Bulk(Some(host))), Some(Reply::Integer(port))) = (m.first(), m.get(1))
        else {
            continue;
        };
        let Some(host) = std::str::from_utf8(host).ok() else {
            continue;
        };
        let Some(master) = address(&format!("{host}:{port}"), from) else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (u16::try_from(*a), u16::try_from(*b)) {
            if a <= b && (b as usize) < SLOTS {
                out.push((a, b, master));
            }
        }
    }
    Some(out)
}

/// Decodes one framed reply.
pub(crate) fn decode<'a>(bytes: &'a [u8], limits: &Limits) -> Option<Reply<'a>> {
    match resp::decode(bytes, limits) {
        Ok(Status::Complete((reply, _))) => Some(reply),
        _ => None,
    }
}

/// The bytes of every command a link of a cluster member still owes a reply to (in the order
/// of the replies owed to callers and to nobody), kept so that a command redirected by
/// `MOVED` or `ASK` can be sent again to the node named.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    bytes: Vec<u8>,
    head: usize,
    /// Each command's length in `bytes`, how many replies come before its own, how many
    /// redirections it followed, and whether a `WAIT` follows it.
    entries: VecDeque<(u32, u32, u8, bool)>,
}

impl Kept {
    /// Keeps the command queued last: `bytes`, with `before` replies before its own, and a
    /// `WAIT` after it if `wait`.
    pub fn push(&mut self, bytes: &[u8], before: usize, hops: u8, wait: bool) {
        if self.entries.is_empty() {
            self.bytes.clear();
            self.head = 0;
        } else if self.head > 0 && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
        self.bytes.extend_from_slice(bytes);
        self.entries
            .push_back((bytes.len() as u32, before as u32, hops, wait));
    }

    /// The oldest command kept, answered now: its bytes, `before`, hops and whether a `WAIT`
    /// follows it.
    pub fn pop(&mut self) -> Option<(&[u8], usize, u8, bool)> {
        let (len, before, hops, wait) = self.entries.pop_front()?;
        let start = self.head;
        self.head = (start + len as usize).min(self.bytes.len());
        Some((&self.bytes[start..self.head], before as usize, hops, wait))
    }

    /// The connection broke: nothing it owed will be answered.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.head = 0;
        self.entries.clear();
    }
}

/// A cluster member's slot map and the state of its topology reads.
#[derive(Debug)]
pub(crate) struct Topology {
    /// The link serving each slot, [`NONE`] for none.
    map: Vec<u32>,
    /// A topology has been read: a slot without a link is served by no master.
    pub known: bool,
    /// A topology read is under way, sent at this instant.
    pub asked: Option<Instant>,
    /// When the last topology read was sent.
    pub last: Option<Instant>,
    /// A read is wanted as soon as [`REFRESH_MIN_GAP`] allows (a `MOVED`, a broken link).
    pub want: bool,
    /// When the next periodic read is due.
    pub next: Instant,
    /// The cluster does not know `CLUSTER SHARDS` (before 7.0): `CLUSTER SLOTS` is asked.
    pub slots_only: bool,
    /// A slot a command was refused for, the map giving it no master (a failover under way),
    /// and until when the topology is read again on its own while the map still gives it
    /// none (see [`chase`](Self::chase)).
    chase: Option<(u16, Instant)>,
}

impl Topology {
    pub fn new(now: Instant) -> Topology {
        Topology {
            map: vec![NONE; SLOTS],
            known: false,
            asked: None,
            last: None,
            want: true,
            next: now,
            slots_only: false,
            chase: None,
        }
    }

    /// A command was refused at `now` because the map gives `slot` no master: the topology is
    /// read again as soon as [`REFRESH_MIN_GAP`] allows, and again after each read that still
    /// gives it none, for [`REFRESH_PERIOD`] at most, whether or not another command comes
    /// (the endpoint asks to be tended meanwhile): a lock asked for once the failover settled
    /// finds the new master in the map.
    pub fn chase(&mut self, slot: u16, now: Instant) {
        self.want = true;
        self.chase = Some((slot, now + REFRESH_PERIOD));
    }

    /// Whether a slot refused for want of a master is still chased at `now`.
    pub fn chasing(&self, now: Instant) -> bool {
        self.chase
            .is_some_and(|(slot, until)| until > now && self.map[slot as usize] == NONE)
    }

    /// A topology read was answered at `now` (the map replaced): a slot chased that has a
    /// master now is no longer chased; one that has none is read again.
    pub fn read(&mut self, now: Instant) {
        match self.chase {
            Some((slot, until)) if until > now && self.map[slot as usize] == NONE => {
                self.want = true
            }
            _ => self.chase = None,
        }
    }

    /// The link serving `slot`, if one is known to.
    pub fn link(&self, slot: u16) -> Option<usize> {
        match self.map[slot as usize] {
            NONE => None,
            l => Some(l as usize),
        }
    }

    /// `slot` is served by `link` (a `MOVED`).
    pub fn set(&mut self, slot: u16, link: usize) {
        self.map[slot as usize] = link as u32;
    }

    /// Replaces the map by `ranges`, each with the link of its master (`None`: it has none,
    /// and its slots are served by no link).
    pub fn replace(&mut self, ranges: &[(u16, u16, Option<usize>)]) {
        self.map.fill(NONE);
        for &(a, b, link) in ranges {
            if let Some(l) = link {
                self.map[a as usize..=b as usize].fill(l as u32);
            }
        }
        self.known = true;
    }

    /// When a topology read should be sent, if one should at all.
    pub fn due(&self) -> Option<Instant> {
        if let Some(asked) = self.asked {
            return Some(asked + REFRESH_STALE);
        }
        let gap = self.last.map(|l| l + REFRESH_MIN_GAP);
        let next = if self.want {
            gap.unwrap_or(self.next)
        } else {
            self.next
        };
        Some(match gap {
            Some(g) => next.max(g),
            None => next,
        })
    }
}

impl Endpoint {
    /// The link of cluster member `member` that `t` goes to: the master of the slot of its
    /// first key, as the slot map says; the seed link while no topology was read, or for a
    /// command without a key. A slot that the topology last read gives no master fails the
    /// member for this command, as the cluster would (`CLUSTERDOWN`).
    pub(super) fn route<M: Machine>(
        &mut self,
        member: usize,
        t: &Transmit,
        m: &M,
        now: Instant,
    ) -> Result<usize, NodeErrorKind> {
        let caps = self.nodes[member].server.caps;
        self.scratch.clear();
        m.encode(t, caps, &mut self.scratch);
        let slot = first_key_slot(&self.scratch);
        self.refresh_if_due(member, now);
        let Some(topo) = &self.topo[member] else {
            return Ok(member);
        };
        match slot.map(|s| (s, topo.link(s))) {
            None => Ok(member),
            Some((_, Some(link))) => Ok(link),
            Some((_, None)) if !topo.known => Ok(member),
            Some((s, None)) => {
                // The cluster may be electing a new master for it: read again soon, and
                // until a master serves it (see `Topology::chase`).
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.chase(s, now);
                }
                Err(NodeErrorKind::Server {
                    kind: crate::resp::ServerErrorKind::ClusterDown,
                    message: format!(
                        "CLUSTERDOWN no master serves hash slot {s} in the cluster's topology"
                    ),
                })
            }
        }
    }

    /// The address node `link`'s command connection is to (or was last to).
    pub(super) fn link_target(&self, link: usize) -> Option<std::net::SocketAddr> {
        match self.node_addr(link).target(self.nodes[link].cmd.trying) {
            Target::Tcp(a) => Some(a),
            Target::Unix(_) => None,
        }
    }

    /// The link of cluster member `member` to the master at `addr`, added if there is none
    /// (in the place of a link given up, if there is one; its server taken to be what the
    /// member's seed said, until its setup says). `None` is never returned today: a member
    /// has as many links as its cluster has masters.
    pub(super) fn link_for(
        &mut self,
        member: usize,
        addr: std::net::SocketAddr,
        now: Instant,
    ) -> Option<usize> {
        let found = (self.members..self.nodes.len()).find(|&l| {
            self.nodes[l].member == member
                && self.nodes[l]
                    .addr
                    .as_ref()
                    .is_some_and(|a| a.addrs[0] == addr)
        });
        if found.is_some() {
            return found;
        }
        let server = self.nodes[member].server;
        let node = Node {
            member,
            addr: Some(Box::new(self.config.nodes[member].master(addr))),
            kept: Kept::default(),
            awaiting: None,
            cmd: Conn::new(true, now),
            sub: Conn::new(false, now),
            server,
            known: false,
            retries: Vec::new(),
            retry_bytes: Vec::new(),
            again_at: None,
            again_backoff: BACKOFF_MIN,
            unsent: [None; UNSENT],
            unsent_next: 0,
            unconfirmed: Unconfirmed::default(),
            unwaited: false,
            given: [None; GIVEN],
            given_next: 0,
        };
        let link = match self.free.pop() {
            Some(l) => {
                self.nodes[l] = node;
                l
            }
            None => {
                self.nodes.push(node);
                self.channels.grow(self.nodes.len());
                self.nodes.len() - 1
            }
        };
        Some(link)
    }

    /// Whether node `i` is the place of a link given up: nothing is connected there.
    pub(super) fn is_free(&self, i: usize) -> bool {
        i >= self.members && self.nodes[i].addr.is_none()
    }

    /// After a topology read of cluster member `member` (read on link `reading`), whose map
    /// names the links `in_use`: its other links to masters (not its seed link) are closed and
    /// their places freed for the next masters, once they owe nothing (no reply to a command,
    /// no compare-and-delete to send again or waiting for a `WAIT` to confirm it, no `WAIT`,
    /// no wake channel there and no subscription or unsubscription unconfirmed).
    /// A link that still owes is looked at again after the next read; so is `reading`, whose
    /// socket is being read. Without this, a master that changes address (a pod restarted with
    /// a new IP, a failover to a replacement node) would leave a link behind every time.
    pub(super) fn reclaim_links(
        &mut self,
        member: usize,
        reading: usize,
        in_use: &Bits,
        now: Instant,
    ) {
        for l in self.members..self.nodes.len() {
            let node = &self.nodes[l];
            let idle = node.cmd.owed() == 0
                && !node.cmd.has_pending_output()
                && node.retries.is_empty()
                && node.awaiting.is_none()
                && !node.unconfirmed.owes_until(now)
                && !node.sub.has_pending_output()
                && !self.channels.uses(l, member);
            if node.member != member
                || self.is_free(l)
                || l == reading
                || in_use.contains(l)
                || !idle
            {
                continue;
            }
            for sub in [false, true] {
                let id = ConnId { node: l, sub };
                if self.is_open(id) {
                    self.io.push_back(Io::Close(id));
                }
            }
            // Confirmations its pub/sub connection owed will not come: nobody waits for them.
            self.channels.lost_subscriber(l, &mut self.mail);
            let node = &mut self.nodes[l];
            node.addr = None;
            node.kept.clear();
            node.unconfirmed = Unconfirmed::default();
            node.cmd = Conn::new(true, now);
            node.sub = Conn::new(false, now);
            node.server = Server::for_member(true);
            node.known = false;
            node.retry_bytes.clear();
            self.free.push(l);
        }
    }

    /// Sends a topology read of cluster member `member`: on its seed link if that is set up,
    /// else on a master's link that is, else on the seed link if it can take it (connecting
    /// it), else on any link that is up; if none can, it stays wanted.
    pub(super) fn refresh(&mut self, member: usize, now: Instant) {
        let links = || (self.members..self.nodes.len()).filter(|&l| self.nodes[l].member == member);
        let link = if self.nodes[member].cmd.is_ready() {
            Some(member)
        } else if let Some(l) = links().find(|&l| self.nodes[l].cmd.is_ready()) {
            Some(l)
        } else if self.nodes[member].cmd.can_send(now) {
            Some(member)
        } else {
            links().find(|&l| self.nodes[l].cmd.is_up())
        };
        let Some(topo) = self.topo[member].as_mut() else {
            return;
        };
        topo.last = Some(now);
        topo.next = now + REFRESH_PERIOD;
        let Some(link) = link else {
            topo.want = true;
            return;
        };
        topo.want = false;
        topo.asked = Some(now);
        let slots_only = topo.slots_only;
        self.connect_if_down(link, now);
        self.nodes[link].cmd.queue(Slot::Topology, None, |out| {
            let what: &[u8] = if slots_only { b"SLOTS" } else { b"SHARDS" };
            crate::resp::encode_command(out, &[b"CLUSTER", what]);
            0
        });
        self.touch(ConnId {
            node: link,
            sub: false,
        });
    }

    /// A topology read's reply came on `link`: the member's slot map is what it says (or the
    /// older form is asked next, for a server without `CLUSTER SHARDS`). A server with cluster
    /// support disabled fails the link as a configuration error.
    pub(super) fn read_topology(&mut self, link: usize, bytes: &[u8], now: Instant) {
        let member = self.nodes[link].member;
        let from = self.link_target(link);
        let tls = self.config.nodes[member].tls;
        let limits = self.config.limits;
        let Some(slots_only) = self.topo[member].as_ref().map(|t| t.slots_only) else {
            return;
        };
        let reply = decode(bytes, &limits);
        let ranges = match &reply {
            Some(Reply::Error(m)) if !slots_only && m.starts_with(b"ERR unknown subcommand") => {
                if let Some(topo) = self.topo[member].as_mut() {
                    topo.slots_only = true;
                    topo.asked = None;
                }
                self.refresh(member, now);
                return;
            }
            Some(Reply::Error(m)) if m.windows(8).any(|w| w == b"disabled") => {
                let command = if slots_only {
                    "CLUSTER SLOTS"
                } else {
                    "CLUSTER SHARDS"
                };
                let why = NodeErrorKind::Setup {
                    command,
                    cause: Box::new(crate::engine::ops::server_error(m)),
                };
                let id = ConnId {
                    node: link,
                    sub: false,
                };
                self.fail(id, why, now);
                self.io.push_back(Io::Close(id));
                return;
            }
            Some(r) if slots_only => parse_slots(r, from),
            Some(r) => parse_shards(r, tls, from),
            None => None,
        };
        let Some(ranges) = ranges else {
            if let Some(topo) = self.topo[member].as_mut() {
                topo.asked = None;
                topo.want = true;
            }
            return;
        };
        let linked: Vec<(u16, u16, Option<usize>)> = ranges
            .iter()
            .map(|&(a, b, addr)| (a, b, self.link_for(member, addr, now)))
            .collect();
        // A master's certificate is checked against the hostname the cluster announces for it,
        // where it announces one (from its next connect on).
        if let (false, Some(r)) = (slots_only, &reply) {
            for (addr, name) in shard_hostnames(r, tls, from) {
                let link = (self.members..self.nodes.len()).find(|&l| {
                    self.nodes[l].member == member
                        && self.nodes[l]
                            .addr
                            .as_ref()
                            .is_some_and(|a| a.addrs[0] == addr)
                });
                if let Some(a) = link.and_then(|l| self.nodes[l].addr.as_mut()) {
                    a.host = name;
                }
            }
        }
        if let Some(topo) = self.topo[member].as_mut() {
            topo.replace(&linked);
            topo.asked = None;
            topo.read(now);
        }
        // Every master in use is connected ahead of its first command, as members are.
        let mut in_use = Bits::with_room(self.nodes.len());
        for link in linked.iter().filter_map(|&(_, _, l)| l) {
            in_use.insert(link);
            self.connect_if_down(link, now);
        }
        // The cleanups a link no longer in the map ran and no `WAIT` confirmed go to the
        // masters that serve their slots now, as they would had its connection broken (a link
        // that still owes a reply hands them on once it has answered: `hand_off_unmapped`).
        for l in self.members..self.nodes.len() {
            if self.nodes[l].member == member && l != link && !in_use.contains(l) {
                self.hand_off_kept(l, now);
            }
        }
        self.reroute_retries(member, now);
        self.resubscribe(member, now);
        self.reclaim_links(member, link, &in_use, now);
    }

    /// Link `l`'s cleanups that no `WAIT` confirmed become compare-and-deletes owed again,
    /// once the link owes no reply (what it still owes may confirm them): for a link the slot
    /// map no longer names, whose slots other masters serve now.
    fn hand_off_kept(&mut self, l: usize, now: Instant) -> bool {
        let node = &mut self.nodes[l];
        if node.cmd.owed() != 0 || !node.unconfirmed.owes_until(now) {
            return false;
        }
        let Node {
            unconfirmed,
            retries,
            retry_bytes,
            ..
        } = node;
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
        true
    }

    /// After link `l` of a cluster member answered: if the slot map no longer names it (a
    /// topology read gave its slots to other masters while it still owed a reply, so its
    /// kept cleanups stayed), its cleanups go to the masters that serve their slots now, at
    /// once rather than at the next topology read (up to [`REFRESH_PERIOD`] later, or never
    /// within the keys' TTL).
    pub(super) fn hand_off_unmapped(&mut self, l: usize, now: Instant) {
        let member = self.nodes[l].member;
        if l < self.members || !self.nodes[l].unconfirmed.owes_until(now) {
            return;
        }
        let mapped = match self.topo[member].as_ref() {
            Some(t) if t.known => t.map.contains(&(l as u32)),
            _ => true,
        };
        if !mapped && self.hand_off_kept(l, now) {
            self.reroute_retries(member, now);
        }
    }

    /// The compare-and-deletes that the links of cluster member `member` keep for their next
    /// connection go to the master that serves their key's slot now, as the slot map says: a
    /// delete owed on a cluster member belongs to the member and the key's slot, not to the
    /// master it was first sent to (a master that died stays dead; its promoted replica, or
    /// the master the slot moved to, holds the key). The old connection broke on the server's
    /// side, so nothing sent on it can still run; on the new master, the delete goes behind
    /// whatever is queued there (an acquisition redirected there earlier included).
    pub(super) fn reroute_retries(&mut self, member: usize, now: Instant) {
        let Some(topo) = self.topo[member].as_ref().filter(|t| t.known) else {
            return;
        };
        let mut moved: Vec<(usize, Retry, Vec<u8>)> = Vec::new();
        // A delete whose slot has no master yet (the cluster electing one): the topology is
        // read again soon, until one is named.
        let mut masterless = false;
        for l in 0..self.nodes.len() {
            let node = &mut self.nodes[l];
            if node.member != member || node.retries.is_empty() {
                continue;
            }
            let owner = |b: &[u8]| first_key_slot(b).and_then(|s| topo.link(s));
            let (mut at, mut elsewhere) = (0, false);
            for r in &node.retries {
                let end = at + r.redo.len as usize;
                let slot = first_key_slot(&node.retry_bytes[at..end]);
                at = end;
                if r.redo.until <= now {
                    continue;
                }
                match slot.map(|s| topo.link(s)) {
                    Some(Some(to)) => elsewhere |= to != l,
                    Some(None) => masterless = true,
                    None => {}
                }
            }
            if !elsewhere {
                continue;
            }
            let retries = std::mem::take(&mut node.retries);
            let bytes = std::mem::take(&mut node.retry_bytes);
            let mut at = 0;
            for r in retries {
                let end = at + r.redo.len as usize;
                let b = &bytes[at..end];
                at = end;
                match owner(b) {
                    Some(to) if to != l && r.redo.until > now => moved.push((to, r, b.to_vec())),
                    _ => {
                        node.retry_bytes.extend_from_slice(b);
                        node.retries.push(r);
                    }
                }
            }
        }
        if masterless {
            if let Some(topo) = self.topo[member].as_mut() {
                topo.want = true;
            }
        }
        for (to, r, b) in moved {
            let node = &mut self.nodes[to];
            if node.cmd.is_down() {
                // Sent first thing on its next connection, started below.
                node.retry_bytes.extend_from_slice(&b);
                node.retries.push(r);
                continue;
            }
            // Its owner, if it still waits, hears from the new master.
            self.queue_owed(to, r.slot.resent(now), r.redo, &b);
            self.wait_after_owed(to);
            self.touch(ConnId {
                node: to,
                sub: false,
            });
        }
        for l in 0..self.nodes.len() {
            if self.nodes[l].member == member && !self.nodes[l].retries.is_empty() {
                self.connect_if_down(l, now);
            }
        }
    }

    /// Follows a redirection read on `from` (see the module docs of `cluster`): `MOVED` moves
    /// the slot in the map and asks for a topology read; the command is sent to the node named
    /// (after `ASKING` for `ASK`) within its node timeout, a compare-and-delete until what it
    /// deletes expires. Otherwise (no such node, too many hops, too late) the owner is given
    /// the redirection as the reply, a failure of that member: never a vote.
    pub(super) fn follow(&mut self, from: usize, r: Redirected, now: Instant) {
        let member = self.nodes[from].member;
        let target = r.to.to.and_then(|a| self.link_for(member, a, now));
        if let Some(topo) = self.topo[member].as_mut() {
            if !r.to.ask {
                if let Some(t) = target {
                    topo.set(r.to.slot, t);
                }
                topo.want = true;
            }
        }
        let redo = match r.slot {
            Slot::Reply { redo, .. } | Slot::Discard { redo, .. } => redo,
            _ => None,
        };
        let worth = match (redo, r.slot) {
            (Some(redo), _) => redo.until > now,
            // An acquisition only while its round waits for it: once the round is over (its
            // owner may have released already), sending it again could only leave a key behind.
            (
                None,
                Slot::Reply {
                    caller,
                    run,
                    due,
                    fired,
                    ..
                },
            ) => !fired && due > now && self.mail.run_of(caller as usize) == Some(run),
            _ => false,
        };
        let to = target.filter(|&t| worth && r.hops < MAX_HOPS && self.nodes[t].cmd.can_send(now));
        let Some(to) = to else {
            // A compare-and-delete for a master in its reconnect backoff waits for its next
            // connection, as on any node.
            let waits = target.filter(|&t| worth && !self.nodes[t].cmd.can_send(now));
            if let (Some(t), Some(redo)) = (waits, redo) {
                let node = &mut self.nodes[t];
                node.retry_bytes.extend_from_slice(&r.bytes);
                node.retries.push(Retry {
                    slot: Slot::Discard {
                        redo: None,
                        given: None,
                    },
                    redo: Redo {
                        until: redo.until,
                        len: r.bytes.len() as u32,
                        before: r.before as u32,
                    },
                });
            }
            if let Slot::Reply {
                caller, run, tag, ..
            } = r.slot
            {
                self.mail
                    .post_reply(caller as usize, run, member, tag, &r.reply);
            }
            return;
        };
        self.connect_if_down(to, now);
        let mut bytes = Vec::with_capacity(r.bytes.len() + 16);
        let mut before = r.before;
        if r.to.ask {
            crate::resp::encode_command(&mut bytes, &[b"ASKING"]);
            before += 1;
        }
        bytes.extend_from_slice(&r.bytes);
        self.nodes[to]
            .cmd
            .queue(r.slot, redo.map(|r| r.until), |out| {
                out.extend_from_slice(&bytes);
                before
            });
        self.nodes[to].kept.push(&bytes, before, r.hops + 1, r.wait);
        if r.wait {
            self.queue_wait(to);
        }
        self.touch(ConnId {
            node: to,
            sub: false,
        });
    }

    /// Sends a topology read of cluster member `member` if one is due (none is under way, or
    /// the one under way went unanswered for too long).
    pub(super) fn refresh_if_due(&mut self, member: usize, now: Instant) {
        self.sentinels_if_due(member, now);
        let due = self.topo[member]
            .as_ref()
            .is_some_and(|t| t.due().is_some_and(|d| d <= now));
        if due {
            self.refresh(member, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_cluster_computes() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn the_first_key_of_commands_and_sequences_gives_the_slot() {
        let mut out = Vec::new();
        resp::encode_command(&mut out, &[b"SET", b"k", b"t", b"NX", b"PX", b"10"]);
        assert_eq!(first_key_slot(&out), Some(key_slot(b"k")));
        out.clear();
        resp::encode_command(
            &mut out,
            &[b"EVALSHA", b"abc", b"2", b"{rw:k}:w", b"{rw:k}:r"],
        );
        assert_eq!(first_key_slot(&out), Some(key_slot(b"rw:k")));
        out.clear();
        resp::encode_command(&mut out, &[b"EVAL", b"return 1", b"0", b"x"]);
        assert_eq!(first_key_slot(&out), None);
        out.clear();
        resp::encode_command(&mut out, &[b"MULTI"]);
        resp::encode_command(&mut out, &[b"PUBLISH", b"chan", b"t"]);
        resp::encode_command(&mut out, &[b"HDEL", b"{rw:k}:w", b"t"]);
        resp::encode_command(&mut out, &[b"EXEC"]);
        assert_eq!(first_key_slot(&out), Some(key_slot(b"rw:k")));
    }

    #[test]
    fn redirections_name_the_slot_and_where_it_went() {
        let from = Some("127.0.0.1:7000".parse().unwrap());
        assert_eq!(
            redirect(b"-MOVED 3999 127.0.0.1:6381\r\n", from),
            Some(Redirect {
                ask: false,
                slot: 3999,
                to: Some("127.0.0.1:6381".parse().unwrap())
            })
        );
        assert_eq!(
            redirect(b"-ASK 1 :6380\r\n", from),
            Some(Redirect {
                ask: true,
                slot: 1,
                to: Some("127.0.0.1:6380".parse().unwrap())
            })
        );
        assert_eq!(redirect(b"-MOVED 16384 127.0.0.1:1\r\n", from), None);
        assert_eq!(redirect(b"-TRYAGAIN Multiple keys\r\n", from), None);
        assert_eq!(
            redirect(b"-MOVED 5 ::1:7000\r\n", from).unwrap().to,
            Some("[::1]:7000".parse().unwrap())
        );
    }

    #[test]
    fn shards_give_the_online_master_of_each_range() {
        let shard = |slots: Vec<Reply<'static>>, nodes: Vec<Reply<'static>>| {
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"slots")),
                Reply::Array(Some(slots)),
                Reply::Bulk(Some(b"nodes")),
                Reply::Array(Some(nodes)),
            ]))
        };
        let node = |port: i64, role: &'static [u8], health: &'static [u8]| {
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"id")),
                Reply::Bulk(Some(b"x")),
                Reply::Bulk(Some(b"port")),
                Reply::Integer(port),
                Reply::Bulk(Some(b"ip")),
                Reply::Bulk(Some(b"127.0.0.1")),
                Reply::Bulk(Some(b"role")),
                Reply::Bulk(Some(role)),
                Reply::Bulk(Some(b"health")),
                Reply::Bulk(Some(health)),
            ]))
        };
        let reply = Reply::Array(Some(vec![
            shard(
                vec![
                    Reply::Integer(0),
                    Reply::Integer(10),
                    Reply::Integer(20),
                    Reply::Integer(30),
                ],
                vec![
                    node(7001, b"replica", b"online"),
                    node(7000, b"master", b"online"),
                ],
            ),
            shard(
                vec![Reply::Integer(11), Reply::Integer(19)],
                vec![node(7002, b"master", b"fail")],
            ),
        ]));
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            parse_shards(&reply, false, None),
            Some(vec![(0, 10, a), (20, 30, a)])
        );
        let slots = Reply::Array(Some(vec![Reply::Array(Some(vec![
            Reply::Integer(0),
            Reply::Integer(16383),
            Reply::Array(Some(vec![Reply::Bulk(Some(b"")), Reply::Integer(7000)])),
        ]))]));
        assert_eq!(parse_slots(&slots, Some(a)), Some(vec![(0, 16383, a)]));
    }

    #[test]
    fn shards_name_the_hostname_a_master_announces() {
        let node = |port: i64, hostname: &'static [u8]| {
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"port")),
                Reply::Integer(port),
                Reply::Bulk(Some(b"tls-port")),
                Reply::Integer(port + 1000),
                Reply::Bulk(Some(b"ip")),
                Reply::Bulk(Some(b"127.0.0.2")),
                Reply::Bulk(Some(b"hostname")),
                Reply::Bulk(Some(hostname)),
                Reply::Bulk(Some(b"role")),
                Reply::Bulk(Some(b"master")),
                Reply::Bulk(Some(b"health")),
                Reply::Bulk(Some(b"online")),
            ]))
        };
        let shard = |a: i64, b: i64, n: Reply<'static>| {
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"slots")),
                Reply::Array(Some(vec![Reply::Integer(a), Reply::Integer(b)])),
                Reply::Bulk(Some(b"nodes")),
                Reply::Array(Some(vec![n])),
            ]))
        };
        let reply = Reply::Array(Some(vec![
            shard(0, 99, node(7000, b"redis-0.example")),
            // No hostname set: the cluster gives "", and the IP is the name.
            shard(100, 16383, node(7001, b"")),
        ]));
        let tls: SocketAddr = "127.0.0.2:8000".parse().unwrap();
        assert_eq!(
            shard_hostnames(&reply, true, None),
            [(tls, "redis-0.example".to_owned())]
        );
        assert_eq!(
            parse_shards(&reply, true, None),
            Some(vec![
                (0, 99, tls),
                (100, 16383, "127.0.0.2:8001".parse().unwrap())
            ])
        );
    }

    #[test]
    fn a_shard_master_without_an_ip_is_the_node_that_answered() {
        // A node that never met another (a one-master cluster) knows no IP of its own and
        // gives "" for it, as in CLUSTER SLOTS.
        let reply = Reply::Array(Some(vec![Reply::Array(Some(vec![
            Reply::Bulk(Some(b"slots")),
            Reply::Array(Some(vec![Reply::Integer(0), Reply::Integer(16383)])),
            Reply::Bulk(Some(b"nodes")),
            Reply::Array(Some(vec![Reply::Array(Some(vec![
                Reply::Bulk(Some(b"port")),
                Reply::Integer(7000),
                Reply::Bulk(Some(b"ip")),
                Reply::Bulk(Some(b"")),
                Reply::Bulk(Some(b"role")),
                Reply::Bulk(Some(b"master")),
                Reply::Bulk(Some(b"health")),
                Reply::Bulk(Some(b"online")),
            ]))])),
        ]))]));
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            parse_shards(&reply, false, Some(a)),
            Some(vec![(0, 16383, a)])
        );
    }
}
