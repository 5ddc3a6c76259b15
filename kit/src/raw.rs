//! The raw baseline: the least a Redlock client can do on the wire, by hand.
//!
//! Blocking `std` sockets with `TCP_NODELAY`, one per node. Acquire writes `SET key token NX PX
//! ttl` to all N sockets, then reads the replies; release writes `EVALSHA` of a
//! compare-and-delete script to all N, then reads the replies. The command is encoded once per
//! round into a reused buffer; nothing is allocated per operation. There is no reconnect and no
//! validity arithmetic, and a node that does not answer within [`READ_TIMEOUT`] ends the run
//! with an error: it is a floor to measure against, not a client.
//!
//! Two ways of reading the replies:
//! - all N ([`Raw::connect`]): the replies are read node after node; the round ends when every
//!   node has answered;
//! - at the quorum ([`Raw::at_quorum`]): `poll(2)` on the sockets still owing a reply, and the
//!   round ends as soon as a quorum said yes (or enough said no that none can be reached). The
//!   late replies are skipped when the next round reads that node. This is the ideal
//!   single-caller client (`rawQ`); one per thread is `rawN` of the scale benchmark.
//!
//! Also [`RawQRw`] (`rawQ-rw`): the ideal client of the read-write lock design's scripts, its scripts by
//! `EVALSHA` to all N sockets at once, returning at the quorum; and [`Probe`]: one more
//! connection per node, for what the servers say of themselves (`CLIENT LIST`, `INFO cpu`).
//!
//! Std and `rustix` (for `poll`) only: the baseline of `redlock-mux bench` and of the peer
//! benchmark (`benches/peers`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Compare-and-delete that announces the release, the same work a release does in the library
/// (its script publishes on a wake channel), so that release timings compare like for like.
pub const RELEASE_SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";

/// Prefix of the channel a release is announced on (followed by the key).
pub const WAKE_PREFIX: &[u8] = b"redlock-mux:wake:";

/// How long any read waits for a node before the run fails: long next to any reply, so that
/// a stopped server ends a benchmark instead of hanging it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Most nodes a quorum round polls.
const MAX_NODES: usize = 64;

/// Replies the baseline understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Ok,
    Nil,
    Int(i64),
    Other,
}

struct Node {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    start: usize,
    /// Replies still owed by earlier rounds that returned at the quorum without them: skipped
    /// before the next reply is taken.
    stale: usize,
}

impl Node {
    fn new(stream: TcpStream) -> Node {
        Node {
            stream,
            buf: Vec::with_capacity(4096),
            start: 0,
            stale: 0,
        }
    }

    /// The next reply of the current round if it is buffered, after skipping stale ones. Only
    /// what lock commands return is parsed; bulk payloads are skipped.
    fn take_reply(&mut self) -> io::Result<Option<Reply>> {
        loop {
            let Some((reply, used)) = parse(&self.buf[self.start..])? else {
                return Ok(None);
            };
            self.start += used;
            if self.start == self.buf.len() {
                self.buf.clear();
                self.start = 0;
            }
            if self.stale > 0 {
                self.stale -= 1;
                continue;
            }
            return Ok(Some(reply));
        }
    }

    /// One `read` from the socket into the buffer (blocking, up to [`READ_TIMEOUT`]).
    fn fill(&mut self) -> io::Result<()> {
        let len = self.buf.len();
        self.buf.resize(len + 4096, 0);
        let got = self.stream.read(&mut self.buf[len..]);
        self.buf.truncate(len + *got.as_ref().unwrap_or(&0));
        match got? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            _ => Ok(()),
        }
    }

    /// Reads one reply of the current round.
    fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some(reply) = self.take_reply()? {
                return Ok(reply);
            }
            self.fill()?;
        }
    }
}

/// One reply from the front of `b`, with its length, or `None` if more bytes are needed.
fn parse(b: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &b[1..eol];
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected reply");
    let num = || -> io::Result<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)
    };
    match b[0] {
        b'+' if line == b"OK" => Ok(Some((Reply::Ok, eol + 2))),
        b'+' | b'-' => Ok(Some((Reply::Other, eol + 2))),
        b':' => Ok(Some((Reply::Int(num()?), eol + 2))),
        b'$' => match num()? {
            -1 => Ok(Some((Reply::Nil, eol + 2))),
            n if n >= 0 => {
                let end = eol + 2 + n as usize + 2;
                Ok((b.len() >= end).then_some((Reply::Other, end)))
            }
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The decimal digits of `n`: `buf[start..]`.
fn digits(n: u64) -> ([u8; 20], usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return (buf, i);
        }
    }
}

fn write_len(out: &mut Vec<u8>, prefix: u8, n: usize) {
    let (buf, start) = digits(n as u64);
    out.push(prefix);
    out.extend_from_slice(&buf[start..]);
    out.extend_from_slice(b"\r\n");
}

fn write_bulk(out: &mut Vec<u8>, parts: &[&[u8]]) {
    write_len(out, b'$', parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| out.extend_from_slice(p));
    out.extend_from_slice(b"\r\n");
}

fn write_u64(out: &mut Vec<u8>, n: u64) {
    let (buf, start) = digits(n);
    write_bulk(out, &[&buf[start..]]);
}

/// `SCRIPT LOAD` of `body` on a blocking `node`; returns the digest. The digest comes back as a
/// bulk string, read raw.
fn script_load(node: &mut Node, body: &str) -> io::Result<[u8; 40]> {
    let mut cmd = Vec::new();
    write_len(&mut cmd, b'*', 3);
    write_bulk(&mut cmd, &[b"SCRIPT"]);
    write_bulk(&mut cmd, &[b"LOAD"]);
    write_bulk(&mut cmd, &[body.as_bytes()]);
    node.stream.write_all(&cmd)?;
    let mut reply = [0u8; 64];
    let mut got = 0;
    while !reply[..got].ends_with(b"\r\n") || got < 47 {
        if (got > 0 && reply[0] != b'$') || got == reply.len() {
            return Err(io::Error::other("SCRIPT LOAD refused"));
        }
        let k = node.stream.read(&mut reply[got..])?;
        if k == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += k;
    }
    // "$40\r\n" + 40 hex digits + "\r\n"
    let mut sha = [0u8; 40];
    sha.copy_from_slice(&reply[5..45]);
    Ok(sha)
}

/// One node to connect to: its address, and the commands to send before anything else (such
/// as `AUTH` and `SELECT`), each as its arguments; each must be answered `+OK`.
#[derive(Debug, Clone)]
pub struct Target {
    /// The node's addresses (those its host name resolved to), tried in turn.
    pub addrs: Vec<SocketAddr>,
    /// Commands sent first, in order.
    pub setup: Vec<Vec<Vec<u8>>>,
}

impl Target {
    /// A node at `addr` that needs no setup.
    pub fn plain(addr: SocketAddr) -> Target {
        Target {
            addrs: vec![addr],
            setup: Vec::new(),
        }
    }
}

/// The raw baseline over N nodes.
pub struct Raw {
    nodes: Vec<Node>,
    out: Vec<u8>,
    sha: [u8; 40],
    quorum: usize,
    /// Whether a round returns at the quorum rather than after all N replies.
    at_quorum: bool,
}

impl Raw {
    /// Connects to every node (with `TCP_NODELAY`) and loads the release script.
    pub fn connect(addrs: &[SocketAddr]) -> io::Result<Raw> {
        let targets: Vec<Target> = addrs.iter().copied().map(Target::plain).collect();
        Raw::connect_targets(&targets)
    }

    /// Connects to every target (with `TCP_NODELAY`), sends its setup commands, and loads the
    /// release script.
    pub fn connect_targets(targets: &[Target]) -> io::Result<Raw> {
        let mut raw = Raw {
            nodes: Vec::with_capacity(targets.len()),
            out: Vec::with_capacity(512),
            sha: [0; 40],
            quorum: targets.len() / 2 + 1,
            at_quorum: false,
        };
        if targets.len() > MAX_NODES {
            return Err(io::Error::other(format!("at most {MAX_NODES} nodes")));
        }
        for target in targets {
            raw.nodes.push(connect_node(target)?);
        }
        for node in &mut raw.nodes {
            raw.sha = script_load(node, RELEASE_SCRIPT)?;
        }
        Ok(raw)
    }

    /// Makes every round return as soon as its outcome is known (a quorum of yes, or too many
    /// no for one), instead of after all N replies: the ideal single-caller client.
    pub fn at_quorum(mut self) -> Raw {
        self.at_quorum = true;
        self
    }

    /// Writes `self.out` to every node, then reads the replies; returns how many said yes by
    /// `yes` (at the quorum: by the time the outcome was known).
    fn round(&mut self, yes: impl Fn(Reply) -> bool) -> io::Result<usize> {
        for node in &mut self.nodes {
            node.stream.write_all(&self.out)?;
        }
        if self.at_quorum {
            return self.read_to_quorum(yes);
        }
        let mut granted = 0;
        for node in &mut self.nodes {
            if yes(node.read_reply()?) {
                granted += 1;
            }
        }
        Ok(granted)
    }

    /// Reads replies as they come, from whichever node has one, until the round's outcome is
    /// known; the nodes that have not answered by then owe a stale reply.
    fn read_to_quorum(&mut self, yes: impl Fn(Reply) -> bool) -> io::Result<usize> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let n = self.nodes.len();
        let mut pending = [true; MAX_NODES];
        let (mut granted, mut refused) = (0, 0);
        let decided = |granted: usize, refused: usize| {
            granted >= self.quorum || refused > n - self.quorum || granted + refused == n
        };
        let timeout = Timespec {
            tv_sec: READ_TIMEOUT.as_secs() as _,
            tv_nsec: 0,
        };
        loop {
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if pending[i] {
                    if let Some(reply) = node.take_reply()? {
                        pending[i] = false;
                        if yes(reply) {
                            granted += 1;
                        } else {
                            refused += 1;
                        }
                    }
                }
            }
            if decided(granted, refused) {
                break;
            }
            // The sockets still owing a reply, by index; the array is filled to its fixed size
            // with the first of them (only the first `k` entries are polled).
            let mut which = [0usize; MAX_NODES];
            let mut k = 0;
            for i in (0..n).filter(|&i| pending[i]) {
                which[k] = i;
                k += 1;
            }
            let mut readable = [false; MAX_NODES];
            {
                let nodes = &self.nodes;
                let mut fds: [PollFd<'_>; MAX_NODES] = std::array::from_fn(|j| {
                    PollFd::new(&nodes[which[j.min(k - 1)]].stream, PollFlags::IN)
                });
                if poll(&mut fds[..k], Some(&timeout))? == 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                for j in 0..k {
                    readable[which[j]] = !fds[j].revents().is_empty();
                }
            }
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if readable[i] {
                    // The socket is readable: this read does not block.
                    node.fill()?;
                }
            }
        }
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if pending[i] {
                node.stale += 1;
            }
        }
        Ok(granted)
    }

    /// One attempt: `SET key token NX PX ttl_ms` on all nodes. On a quorum, returns true; else
    /// releases on all nodes and returns false.
    pub fn try_acquire(&mut self, key: &[u8], token: &[u8], ttl_ms: u64) -> io::Result<bool> {
        self.out.clear();
        write_len(&mut self.out, b'*', 6);
        write_bulk(&mut self.out, &[b"SET"]);
        write_bulk(&mut self.out, &[key]);
        write_bulk(&mut self.out, &[token]);
        write_bulk(&mut self.out, &[b"NX"]);
        write_bulk(&mut self.out, &[b"PX"]);
        write_u64(&mut self.out, ttl_ms);
        let granted = self.round(|r| r == Reply::Ok)?;
        if granted >= self.quorum {
            return Ok(true);
        }
        self.release(key, token)?;
        Ok(false)
    }

    /// Retries [`try_acquire`](Self::try_acquire) without any delay until it wins or `deadline`
    /// passes: the lowest hand-off latency polling can give, at the cost of a busy client.
    pub fn acquire_spinning(
        &mut self,
        key: &[u8],
        token: &[u8],
        ttl_ms: u64,
        deadline: Instant,
    ) -> io::Result<bool> {
        loop {
            if self.try_acquire(key, token, ttl_ms)? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::yield_now();
        }
    }

    /// Compare-and-delete on all nodes, by `EVALSHA`; returns how many nodes answered 1.
    pub fn release(&mut self, key: &[u8], token: &[u8]) -> io::Result<usize> {
        self.out.clear();
        write_len(&mut self.out, b'*', 6);
        write_bulk(&mut self.out, &[b"EVALSHA"]);
        write_bulk(&mut self.out, &[&self.sha]);
        write_bulk(&mut self.out, &[b"1"]);
        write_bulk(&mut self.out, &[key]);
        write_bulk(&mut self.out, &[token]);
        write_bulk(&mut self.out, &[WAKE_PREFIX, key]);
        self.round(|r| r == Reply::Int(1))
    }
}

/// Connects to one node (with `TCP_NODELAY` and [`READ_TIMEOUT`]) and sends its setup
/// commands.
fn connect_node(target: &Target) -> io::Result<Node> {
    let stream = connect_first(&target.addrs, Duration::from_secs(1))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut node = Node::new(stream);
    for command in &target.setup {
        let mut out = Vec::new();
        write_len(&mut out, b'*', command.len());
        for arg in command {
            write_bulk(&mut out, &[arg]);
        }
        node.stream.write_all(&out)?;
        if node.read_reply()? != Reply::Ok {
            let name = String::from_utf8_lossy(command.first().map_or(&[][..], |c| c));
            let addr = node
                .stream
                .peer_addr()
                .map_or(String::new(), |a| a.to_string());
            return Err(io::Error::other(format!("{addr}: {name} refused")));
        }
    }
    Ok(node)
}

/// A connection to the first of `addrs` that takes one, each tried in turn for `timeout` (as
/// `redis-cli` does: `localhost` may resolve to `::1` first, and a server bound to
/// `127.0.0.1` refuses it there). The error names every address tried.
pub fn connect_first(addrs: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let mut tried = String::new();
    let mut kind = io::ErrorKind::NotFound;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                if !tried.is_empty() {
                    tried.push_str("; ");
                }
                tried.push_str(&format!("{addr}: {e}"));
                kind = e.kind();
            }
        }
    }
    Err(io::Error::new(kind, tried))
}

/// One connection to a node for what the server says of itself: `INFO` sections and `CLIENT
/// LIST`, read whole. [`Probe::connections`] leaves its own connection out.
pub struct Probe {
    node: Node,
}

impl Probe {
    /// Connects to `target` (sending its setup commands).
    pub fn connect(target: &Target) -> io::Result<Probe> {
        Ok(Probe {
            node: connect_node(target)?,
        })
    }

    /// Connects to a node that needs no setup.
    pub fn connect_addr(addr: SocketAddr) -> io::Result<Probe> {
        Probe::connect(&Target::plain(addr))
    }

    /// The text of `INFO section`.
    pub fn info(&mut self, section: &str) -> io::Result<String> {
        self.text(&[b"INFO", section.as_bytes()])
    }

    /// The server's client connections, not counting this probe's own, from `CLIENT LIST`:
    /// `(all, subscribers)`, where a subscriber has a channel or pattern subscription.
    pub fn connections(&mut self) -> io::Result<Connections> {
        let list = self.text(&[b"CLIENT", b"LIST"])?;
        Ok(Connections::of(&list))
    }

    /// The masters of the Redis Cluster this node belongs to, as `CLUSTER NODES` lists them:
    /// the nodes flagged `master` (not `fail`) that serve at least one slot, in the order listed.
    pub fn cluster_masters(&mut self) -> io::Result<Vec<SocketAddr>> {
        let nodes = self.text(&[b"CLUSTER", b"NODES"])?;
        let mut masters = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                continue;
            }
            if fields.len() <= 8 {
                continue; // a master without slots
            }
            // `ip:port@cport[,hostname]`; a node that never met another has no IP yet (`:port`),
            // and that is the node this probe speaks to.
            let addr = addr.split(['@', ',']).next().unwrap_or("");
            let addr = match addr.strip_prefix(':') {
                Some(port) => format!("{}:{port}", self.node.stream.peer_addr()?.ip()),
                None => addr.to_owned(),
            };
            let addr: SocketAddr = addr.parse().map_err(|_| {
                io::Error::other(format!("CLUSTER NODES: an address that is not one: {addr}"))
            })?;
            masters.push(addr);
        }
        if masters.is_empty() {
            return Err(io::Error::other("CLUSTER NODES: no master serves a slot"));
        }
        Ok(masters)
    }

    /// Sends a command and reads its bulk string reply as text.
    fn text(&mut self, command: &[&[u8]]) -> io::Result<String> {
        let mut cmd = Vec::new();
        write_len(&mut cmd, b'*', command.len());
        for arg in command {
            write_bulk(&mut cmd, &[arg]);
        }
        self.node.stream.write_all(&cmd)?;
        let node = &mut self.node;
        loop {
            if let Some((text, used)) = parse_bulk(&node.buf[node.start..])? {
                node.start += used;
                if node.start == node.buf.len() {
                    node.buf.clear();
                    node.start = 0;
                }
                return Ok(text);
            }
            node.fill()?;
        }
    }

    /// The server's CPU time so far: `used_cpu_sys` + `used_cpu_user` of `INFO cpu`.
    pub fn cpu(&mut self) -> io::Result<Duration> {
        let info = self.info("cpu")?;
        let field = |name: &str| {
            info_field::<String>(&info, name)
                .and_then(|text| decimal_seconds(&text))
                .ok_or_else(|| io::Error::other(format!("INFO cpu: no {name}")))
        };
        Ok(field("used_cpu_sys")? + field("used_cpu_user")?)
    }
}

/// A number of seconds written in decimal (`12.345678`, as `INFO cpu` gives them), to the
/// nanosecond, finer digits dropped. Integer arithmetic only: parsing a float would bring the
/// standard library's decimal-to-float tables into the small command, which uses this.
pub fn decimal_seconds(text: &str) -> Option<Duration> {
    let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    if whole.len() + fraction.len() == 0 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs = match whole {
        "" => 0,
        whole if whole.bytes().all(|b| b.is_ascii_digit()) => whole.parse().ok()?,
        _ => return None,
    };
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    Some(Duration::new(secs, nanos))
}

/// A node's client connections, as `CLIENT LIST` shows them, without the probe's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connections {
    /// Every client connection.
    pub all: u64,
    /// Those subscribed to a channel or pattern (pub/sub connections).
    pub subscribers: u64,
}

impl Connections {
    /// Counts the lines of a `CLIENT LIST` reply; the one that ran `client|list` (the probe's
    /// own, at the time of the listing) is left out.
    fn of(list: &str) -> Connections {
        let mut c = Connections::default();
        for line in list.lines().filter(|l| !l.trim().is_empty()) {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            };
            if matches!(field("cmd"), Some("client|list" | "client")) {
                continue;
            }
            c.all += 1;
            let subscribed = ["sub", "psub", "ssub"]
                .iter()
                .any(|k| field(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) > 0);
            if subscribed || field("flags").is_some_and(|f| f.contains('P')) {
                c.subscribers += 1;
            }
        }
        c
    }
}

/// The value of `name:value` in an `INFO` text.
pub fn info_field<T: std::str::FromStr>(info: &str, name: &str) -> Option<T> {
    info.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// One bulk string from the front of `b` as text, with its length; `None` if more bytes are
/// needed. An error reply is an error.
fn parse_bulk(b: &[u8]) -> io::Result<Option<(String, usize)>> {
    let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = String::from_utf8_lossy(&b[1..eol]);
    match b[0] {
        b'-' => Err(io::Error::other(format!("server error: {line}"))),
        b'$' => {
            let len: usize = line
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad bulk length"))?;
            let end = eol + 2 + len + 2;
            if b.len() < end {
                return Ok(None);
            }
            let text = String::from_utf8_lossy(&b[eol + 2..eol + 2 + len]).into_owned();
            Ok(Some((text, end)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "expected a bulk string",
        )),
    }
}

/// The read-write design's write acquire script, as the design gives it. KEYS readers, writer; ARGV token, the
/// client's clock in ms since the Unix epoch, TTL in ms. Returns 1 (taken), 2 (read-locked) or
/// 3 (write-locked).
pub const SEED_WRITE_ACQUIRE: &str = "local r_key = KEYS[1]
local w_key = KEYS[2]
local tok = ARGV[1]
local now = tonumber(ARGV[2]) -- milliseconds since Unix epoch
local ttl_ms = tonumber(ARGV[3]) -- in milliseconds

redis.call('ZREMRANGEBYSCORE', r_key, 0, now)
if redis.call('ZCARD', r_key) > 0 then
    return 2 -- key is read-locked
end
if redis.call('GET', w_key) ~= false then
    return 3 -- key is write-locked
end
redis.call('SET', w_key, tok, 'PX', ttl_ms)
return 1 -- write lock acquired
";

/// The read-write design's read acquire script, as the design gives it. KEYS readers, writer; ARGV token, the
/// reader's expiry (the client's clock plus the TTL) in ms since the Unix epoch. Returns 1
/// (joined) or 2 (write-locked).
pub const SEED_READ_ACQUIRE: &str = "local r_key = KEYS[1]
local w_key = KEYS[2]
local tok = ARGV[1]
local exp_at = tonumber(ARGV[2]) -- now + ttl, expressed as milliseconds since Unix epoch
local get_result = redis.call('GET', w_key)
if get_result ~= false then
    return 2 -- key is write-locked
end
redis.call('ZADD', r_key, exp_at, tok)
return 1 -- read lock acquired
";

/// A reader's release that announces it, the same work a reader's release does in the library
/// (the design releases with a bare `ZREM`; the announcement is added so that release timings, and
/// the load a release leaves on the nodes behind the quorum, compare like for like).
pub const READ_RELEASE_SCRIPT: &str = "if redis.call('zrem', KEYS[1], ARGV[1]) == 1 then redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";

/// One side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A reader: the read-write design's read acquire, released by `ZREM` (and an announcement).
    Read,
    /// A writer: the read-write design's write acquire, released by the compare-and-delete script.
    Write,
}

/// A node of [`RawQRw`]: a non-blocking socket, and how many replies it still owes.
struct QNode {
    node: Node,
    /// Replies not read yet, this round's included: the first `owed - 1` belong to earlier
    /// rounds, which returned before this node answered.
    owed: usize,
}

impl QNode {
    /// One reply if a whole one is buffered or readable now, without blocking.
    fn try_reply(&mut self) -> io::Result<Option<Reply>> {
        loop {
            if let Some((reply, used)) = parse(&self.node.buf[self.node.start..])? {
                self.node.start += used;
                if self.node.start == self.node.buf.len() {
                    self.node.buf.clear();
                    self.node.start = 0;
                }
                return Ok(Some(reply));
            }
            let len = self.node.buf.len();
            self.node.buf.resize(len + 4096, 0);
            match self.node.stream.read(&mut self.node.buf[len..]) {
                Ok(0) => {
                    self.node.buf.truncate(len);
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(got) => self.node.buf.truncate(len + got),
                Err(e) => {
                    self.node.buf.truncate(len);
                    return match e.kind() {
                        io::ErrorKind::WouldBlock => Ok(None),
                        io::ErrorKind::Interrupted => continue,
                        _ => Err(e),
                    };
                }
            }
        }
    }

    /// Writes all of `out`, spinning while the socket's buffer is full.
    fn write_all(&mut self, mut out: &[u8]) -> io::Result<()> {
        while !out.is_empty() {
            match self.node.stream.write(out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => out = &out[k..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// `rawQ-rw`: the ideal client of the read-write design's read-write lock. Its read and write acquire scripts,
/// exactly as the design gives them, are loaded once (`SCRIPT LOAD`); each attempt writes one
/// `EVALSHA` to all N sockets at once and returns as soon as a quorum granted (or as soon as a
/// quorum can no longer grant), reading whichever node answers first: non-blocking sockets
/// polled in a spin that yields the CPU between passes. The replies of the nodes it did not
/// wait for are read and dropped later. Release is the design's, with the announcement the
/// library's release makes: [`READ_RELEASE_SCRIPT`] (`ZREM`) for a reader, and for a writer the
/// compare-and-delete script (the design's `DELEX` needs Redis 8.4), each returning at the quorum
/// too. The scores are on the client's clock, as the design has them. No timeouts,
/// no validity arithmetic, no reconnect: a floor to measure against, not a client.
pub struct RawQRw {
    nodes: Vec<QNode>,
    /// Which nodes answered this round.
    answered: Vec<bool>,
    out: Vec<u8>,
    read_sha: [u8; 40],
    write_sha: [u8; 40],
    release_sha: [u8; 40],
    read_release_sha: [u8; 40],
    quorum: usize,
}

impl RawQRw {
    /// Connects to every target as [`Raw::connect_targets`] does, loads the read-write design's scripts and
    /// the compare-and-delete script, and makes the sockets non-blocking.
    pub fn connect_targets(targets: &[Target]) -> io::Result<RawQRw> {
        let raw = Raw::connect_targets(targets)?;
        let release_sha = raw.sha;
        let quorum = raw.quorum;
        let mut nodes = Vec::with_capacity(raw.nodes.len());
        let (mut read_sha, mut write_sha, mut read_release_sha) = ([0; 40], [0; 40], [0; 40]);
        for mut node in raw.nodes {
            read_sha = script_load(&mut node, SEED_READ_ACQUIRE)?;
            write_sha = script_load(&mut node, SEED_WRITE_ACQUIRE)?;
            read_release_sha = script_load(&mut node, READ_RELEASE_SCRIPT)?;
            node.stream.set_nonblocking(true)?;
            nodes.push(QNode { node, owed: 0 });
        }
        Ok(RawQRw {
            answered: vec![false; nodes.len()],
            nodes,
            out: Vec::with_capacity(512),
            read_sha,
            write_sha,
            release_sha,
            read_release_sha,
            quorum,
        })
    }

    /// Writes `self.out` to every node, then reads replies as they come until a quorum said
    /// yes by `yes` or can no longer; returns how many said yes by then.
    fn round(&mut self, yes: impl Fn(Reply) -> bool) -> io::Result<usize> {
        // Drop the late replies of earlier rounds that are in already, so none piles up behind
        // a node that is often the slowest.
        for q in &mut self.nodes {
            while q.owed > 0 {
                match q.try_reply()? {
                    Some(_) => q.owed -= 1,
                    None => break,
                }
            }
        }
        for q in &mut self.nodes {
            q.write_all(&self.out)?;
            q.owed += 1;
        }
        self.answered.iter_mut().for_each(|a| *a = false);
        let n = self.nodes.len();
        let (mut granted, mut answered) = (0, 0);
        loop {
            for (q, done) in self.nodes.iter_mut().zip(self.answered.iter_mut()) {
                if *done {
                    continue;
                }
                while let Some(reply) = q.try_reply()? {
                    q.owed -= 1;
                    if q.owed == 0 {
                        *done = true;
                        answered += 1;
                        if yes(reply) {
                            granted += 1;
                        }
                        break;
                    }
                }
            }
            if granted >= self.quorum || granted + (n - answered) < self.quorum {
                return Ok(granted);
            }
            std::thread::yield_now();
        }
    }

    /// One attempt of the read-write design's acquire for `side`, on the readers key `r_key` and the writer
    /// key `w_key`. On a quorum, returns true; else releases on all nodes and returns false.
    pub fn try_acquire(
        &mut self,
        side: Side,
        r_key: &[u8],
        w_key: &[u8],
        token: &[u8],
        ttl_ms: u64,
    ) -> io::Result<bool> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        self.out.clear();
        match side {
            Side::Read => {
                write_len(&mut self.out, b'*', 7);
                write_bulk(&mut self.out, &[b"EVALSHA"]);
                write_bulk(&mut self.out, &[&self.read_sha]);
                write_bulk(&mut self.out, &[b"2"]);
                write_bulk(&mut self.out, &[r_key]);
                write_bulk(&mut self.out, &[w_key]);
                write_bulk(&mut self.out, &[token]);
                write_u64(&mut self.out, now_ms + ttl_ms);
            }
            Side::Write => {
                write_len(&mut self.out, b'*', 8);
                write_bulk(&mut self.out, &[b"EVALSHA"]);
                write_bulk(&mut self.out, &[&self.write_sha]);
                write_bulk(&mut self.out, &[b"2"]);
                write_bulk(&mut self.out, &[r_key]);
                write_bulk(&mut self.out, &[w_key]);
                write_bulk(&mut self.out, &[token]);
                write_u64(&mut self.out, now_ms);
                write_u64(&mut self.out, ttl_ms);
            }
        }
        let granted = self.round(|r| r == Reply::Int(1))?;
        if granted >= self.quorum {
            return Ok(true);
        }
        self.release(side, r_key, w_key, token)?;
        Ok(false)
    }

    /// The release for `side` on all nodes, returning at the quorum; returns how many
    /// nodes had the lock by then.
    pub fn release(
        &mut self,
        side: Side,
        r_key: &[u8],
        w_key: &[u8],
        token: &[u8],
    ) -> io::Result<usize> {
        self.out.clear();
        match side {
            Side::Read => {
                write_len(&mut self.out, b'*', 6);
                write_bulk(&mut self.out, &[b"EVALSHA"]);
                write_bulk(&mut self.out, &[&self.read_release_sha]);
                write_bulk(&mut self.out, &[b"1"]);
                write_bulk(&mut self.out, &[r_key]);
                write_bulk(&mut self.out, &[token]);
                write_bulk(&mut self.out, &[WAKE_PREFIX, w_key]);
            }
            Side::Write => {
                write_len(&mut self.out, b'*', 6);
                write_bulk(&mut self.out, &[b"EVALSHA"]);
                write_bulk(&mut self.out, &[&self.release_sha]);
                write_bulk(&mut self.out, &[b"1"]);
                write_bulk(&mut self.out, &[w_key]);
                write_bulk(&mut self.out, &[token]);
                write_bulk(&mut self.out, &[WAKE_PREFIX, w_key]);
            }
        }
        self.round(|r| r == Reply::Int(1))
    }
}

/// One try-lock and release of the raw client in `slot` on `key`, with a fresh token: when the
/// lock was acquired, or why the cycle failed. An I/O error empties `slot` (the connections are
/// no longer in step); "no quorum" is contention and keeps it.
pub fn raw_cycle(
    slot: &mut Option<Raw>,
    tokens: &mut Tokens,
    key: &[u8],
    ttl_ms: u64,
) -> Result<Instant, String> {
    let Some(raw) = slot else {
        return Err("could not connect".into());
    };
    let token = tokens.next_token();
    let result = match raw.try_acquire(key, &token, ttl_ms) {
        Ok(true) => {
            let acquired = Instant::now();
            raw.release(key, &token)
                .map(|_| acquired)
                .map_err(|e| format!("release: {e}"))
        }
        Ok(false) => Err("no quorum".to_owned()),
        Err(e) => Err(e.to_string()),
    };
    if result.as_ref().is_err_and(|e| e != "no quorum") {
        *slot = None;
    }
    result
}

/// Distinct 40-byte tokens without a system call: a random-ish prefix and a counter, in hex.
pub struct Tokens {
    seed: u64,
    counter: u64,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens::new()
    }
}

impl Tokens {
    /// A token source whose prefix comes from the clock and the process id.
    pub fn new() -> Tokens {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Tokens {
            seed: t ^ (u64::from(std::process::id()) << 32),
            counter: 0,
        }
    }

    /// The next token.
    pub fn next_token(&mut self) -> [u8; 40] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.counter += 1;
        let mut t = [b'0'; 40];
        for (i, v) in [self.seed, self.counter].iter().enumerate() {
            for k in 0..16 {
                t[i * 20 + 4 + k] = HEX[((v >> (60 - 4 * k)) & 15) as usize];
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lock_replies() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Some((Reply::Ok, 5)));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Reply::Nil, 5)));
        assert_eq!(parse(b":1\r\n").unwrap(), Some((Reply::Int(1), 4)));
        assert_eq!(parse(b"$3\r\nab").unwrap(), None);
        assert_eq!(parse(b"$2\r\nab\r\n").unwrap(), Some((Reply::Other, 8)));
        assert_eq!(parse(b"-ERR x\r\n").unwrap(), Some((Reply::Other, 8)));
        assert!(parse(b"?\r\n").is_err());
    }

    #[test]
    fn parses_info_text() {
        let payload = "# Clients\r\nconnected_clients:7\r\nx:1.5\r\n";
        let reply = format!("${}\r\n{payload}\r\n", payload.len());
        let reply = reply.as_bytes();
        assert_eq!(parse_bulk(&reply[..20]).unwrap(), None);
        let (text, used) = parse_bulk(reply).unwrap().unwrap();
        assert_eq!(used, reply.len());
        assert_eq!(info_field::<u64>(&text, "connected_clients"), Some(7));
        assert_eq!(info_field::<f64>(&text, "x"), Some(1.5));
        assert_eq!(decimal_seconds("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(
            decimal_seconds("12.345678"),
            Some(Duration::new(12, 345_678_000))
        );
        assert_eq!(decimal_seconds("3"), Some(Duration::from_secs(3)));
        assert_eq!(decimal_seconds(".25"), Some(Duration::from_millis(250)));
        assert_eq!(
            decimal_seconds("0.1234567891"),
            Some(Duration::new(0, 123_456_789))
        );
        for bad in ["", ".", "-1.5", "1e3", "1.2.3", "x"] {
            assert_eq!(decimal_seconds(bad), None, "{bad:?}");
        }
        assert_eq!(info_field::<u64>(&text, "connected"), None);
        assert!(parse_bulk(b"-ERR no\r\n").is_err());
    }

    #[test]
    fn counts_client_list_lines() {
        let list = "id=3 addr=127.0.0.1:1 fd=8 name= flags=N db=0 sub=0 psub=0 ssub=0 cmd=set\n\
                    id=4 addr=127.0.0.1:2 fd=9 name= flags=P db=0 sub=2 psub=0 ssub=0 cmd=subscribe\n\
                    id=5 addr=127.0.0.1:3 fd=10 name= flags=N db=0 sub=0 psub=1 cmd=psubscribe\n\
                    id=6 addr=127.0.0.1:4 fd=11 name= flags=N db=0 sub=0 psub=0 ssub=0 cmd=client|list\n";
        assert_eq!(
            Connections::of(list),
            Connections {
                all: 3,
                subscribers: 2
            }
        );
    }

    #[test]
    fn stale_replies_are_skipped() {
        let (a, _b) = loopback_pair();
        let mut node = Node::new(a);
        node.buf.extend_from_slice(b"$-1\r\n:1\r\n+OK\r\n");
        node.stale = 2;
        assert_eq!(node.take_reply().unwrap(), Some(Reply::Ok));
        assert_eq!(node.stale, 0);
        assert_eq!(node.take_reply().unwrap(), None);
    }

    fn loopback_pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    #[test]
    fn tokens_differ() {
        let mut t = Tokens::new();
        assert_ne!(t.next_token(), t.next_token());
    }
}
