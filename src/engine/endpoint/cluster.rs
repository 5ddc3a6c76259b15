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

use crate::resp::{self, Limits, Reply, Status};

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
