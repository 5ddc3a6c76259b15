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
        // The digest comes back as a bulk string; read it raw.
        for node in &mut raw.nodes {
            let mut cmd = Vec::new();
            write_len(&mut cmd, b'*', 3);
            write_bulk(&mut cmd, &[b"SCRIPT"]);
            write_bulk(&mut cmd, &[b"LOAD"]);
            write_bulk(&mut cmd, &[RELEASE_SCRIPT.as_bytes()]);
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
            raw.sha.copy_from_slice(&reply[5..45]);
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
