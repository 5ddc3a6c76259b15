//! The raw baseline: the least a Redlock client can do on the wire, by hand.
//!
//! Blocking `std` sockets with `TCP_NODELAY`, one per node. Acquire writes `SET key token NX PX
//! ttl` to all N sockets, then reads all N replies; release writes `EVALSHA` of a
//! compare-and-delete script to all N, then reads all N. The command is encoded once per round
//! into a reused buffer; nothing is allocated per operation. There is no timeout handling, no
//! reconnect and no validity arithmetic: it is a floor to measure against, not a client.
//!
//! Std only: the baseline of `redlock-mux bench` (its home), and of the peer benchmark
//! (`benches/peers`), which includes it with `#[path = "../../../cli/src/raw.rs"] mod raw;`.

// Each includer uses a different subset of this API.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Compare-and-delete that announces the release, the same work a release does in the library
/// (its script publishes on a wake channel), so that release timings compare like for like.
pub const RELEASE_SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";

/// Prefix of the channel a release is announced on (followed by the key).
pub const WAKE_PREFIX: &[u8] = b"redlock-mux:wake:";

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
}

impl Node {
    /// Reads one reply. Only what lock commands return is parsed; bulk payloads are skipped.
    fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((reply, used)) = parse(&self.buf[self.start..])? {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return Ok(reply);
            }
            let len = self.buf.len();
            self.buf.resize(len + 4096, 0);
            let got = self.stream.read(&mut self.buf[len..])?;
            self.buf.truncate(len + got);
            if got == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
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
    /// The node's address.
    pub addr: SocketAddr,
    /// Commands sent first, in order.
    pub setup: Vec<Vec<Vec<u8>>>,
}

/// The raw baseline over N nodes.
pub struct Raw {
    nodes: Vec<Node>,
    out: Vec<u8>,
    sha: [u8; 40],
    quorum: usize,
}

impl Raw {
    /// Connects to every node (with `TCP_NODELAY`) and loads the release script.
    pub fn connect(addrs: &[SocketAddr]) -> io::Result<Raw> {
        let targets: Vec<Target> = addrs
            .iter()
            .map(|&addr| Target {
                addr,
                setup: Vec::new(),
            })
            .collect();
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
        };
        for target in targets {
            let stream = TcpStream::connect_timeout(&target.addr, Duration::from_secs(1))?;
            stream.set_nodelay(true)?;
            let mut node = Node {
                stream,
                buf: Vec::with_capacity(4096),
                start: 0,
            };
            for command in &target.setup {
                let mut out = Vec::new();
                write_len(&mut out, b'*', command.len());
                for arg in command {
                    write_bulk(&mut out, &[arg]);
                }
                node.stream.write_all(&out)?;
                if node.read_reply()? != Reply::Ok {
                    let name = String::from_utf8_lossy(command.first().map_or(&[][..], |c| c));
                    return Err(io::Error::other(format!("{}: {name} refused", target.addr)));
                }
            }
            raw.nodes.push(node);
        }
        for node in &mut raw.nodes {
            raw.sha = script_load(node, RELEASE_SCRIPT)?;
        }
        Ok(raw)
    }

    /// Writes `self.out` to every node, then reads every node's reply; returns how many said
    /// yes by `yes`.
    fn round(&mut self, yes: impl Fn(Reply) -> bool) -> io::Result<usize> {
        for node in &mut self.nodes {
            node.stream.write_all(&self.out)?;
        }
        let mut granted = 0;
        for node in &mut self.nodes {
            if yes(node.read_reply()?) {
                granted += 1;
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

/// Seed 000's write acquire script, as the seed gives it. KEYS readers, writer; ARGV token, the
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

/// Seed 000's read acquire script, as the seed gives it. KEYS readers, writer; ARGV token, the
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
/// (seed 000 releases with a bare `ZREM`; the announcement is added so that release timings, and
/// the load a release leaves on the nodes behind the quorum, compare like for like).
pub const READ_RELEASE_SCRIPT: &str = "if redis.call('zrem', KEYS[1], ARGV[1]) == 1 then redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";

/// One side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A reader: seed 000's read acquire, released by `ZREM` (and an announcement).
    Read,
    /// A writer: seed 000's write acquire, released by the compare-and-delete script.
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

/// `rawQ-rw`: the ideal client of seed 000's read-write lock. Its read and write acquire scripts,
/// exactly as the seed gives them, are loaded once (`SCRIPT LOAD`); each attempt writes one
/// `EVALSHA` to all N sockets at once and returns as soon as a quorum granted (or as soon as a
/// quorum can no longer grant), reading whichever node answers first: non-blocking sockets
/// polled in a spin that yields the CPU between passes. The replies of the nodes it did not
/// wait for are read and dropped later. Release is the seed's, with the announcement the
/// library's release makes: [`READ_RELEASE_SCRIPT`] (`ZREM`) for a reader, and for a writer the
/// compare-and-delete script (the seed's `DELEX` needs Redis 8.4), each returning at the quorum
/// too. The scores are on the client's clock, as the seed has them. No timeouts,
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
    /// Connects to every target as [`Raw::connect_targets`] does, loads seed 000's scripts and
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

    /// One attempt of seed 000's acquire for `side`, on the readers key `r_key` and the writer
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

/// Distinct 40-byte tokens without a system call: a random-ish prefix and a counter, in hex.
pub struct Tokens {
    seed: u64,
    counter: u64,
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
    fn tokens_differ() {
        let mut t = Tokens::new();
        assert_ne!(t.next_token(), t.next_token());
    }
}
