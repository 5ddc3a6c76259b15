//! `redlock-mux inspect`: what each node holds for a key, and what that means for the quorum.
//!
//! For a key `K` it reads, on every node, the three things the library may keep for it: the
//! mutex (`K` itself), the read-write lock (writer key, reader set and writer intents, named
//! as [`redlock_mux::Client::read_lock`] documents) and the fair queue of the mutex. Reader
//! and intent expiries are scores on the node's own clock, so they are compared with that
//! node's `TIME`.
#![forbid(unsafe_code)]

use std::io;
use std::time::Duration;

use redlock_mux::resp::Value;
use redlock_mux::KeyNames as Names;

use crate::args::{self, usage};
use crate::node::NodeConn;
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux inspect KEY [--nodes URLS] [--timeout 1s]

Shows, for each node, whether it is reachable, the prefix of the mutex
holder's token and of the read-write lock's writer's token with their PTTL,
the readers and waiting writers (write intents) with their remaining ms, and
the length of the mutex's fair queue. It ends with a summary over the quorum.

Options:
  --nodes URLS   comma-separated redis:// URLs (default: $REDLOCK_NODES)
  --timeout D    connect and read timeout per node (default 1s)
  -h, --help     this text
";

/// Characters of a token shown: enough to tell holders apart, not enough to forge a release.
const TOKEN_PREFIX: usize = 12;
/// Readers or intents listed per node; the rest are counted.
const LISTED: usize = 8;

/// A string key holding a token, or its absence.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Free,
    Held {
        token: Vec<u8>,
        pttl_ms: i64,
    },
    /// A key of another type than a lock's string.
    Other {
        kind: String,
    },
}

/// A member of a sorted set scored by its expiry on the node's clock.
#[derive(Debug, Clone)]
struct Member {
    token: Vec<u8>,
    /// Milliseconds left on the node's clock; zero or less once expired (not yet pruned).
    left_ms: i64,
}

/// What one reachable node holds for the key.
#[derive(Debug)]
struct Node {
    mutex: Slot,
    writer: Slot,
    readers: Vec<Member>,
    intents: Vec<Member>,
    /// Live entries of the fair queue (those whose expiry is still ahead).
    queue: usize,
}

impl Node {
    fn live(set: &[Member]) -> impl Iterator<Item = &Member> {
        set.iter().filter(|m| m.left_ms > 0)
    }
}

/// Entry point of `redlock-mux inspect`.
pub fn main(argv: Vec<std::ffi::OsString>) -> Result<i32, Fail> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(argv);
    let (mut key, mut nodes) = (None, None);
    let mut timeout = Duration::from_secs(1);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("timeout") => timeout = args::duration("--timeout", parser.value()?)?,
            Short('h') | Long("help") => return crate::print_text(HELP),
            Value(value) if key.is_none() => key = Some(args::text("KEY", value)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let key = key.ok_or_else(|| usage!("no KEY given"))?;
    let nodes = args::nodes(nodes)?;
    let names = Names::new(key.as_bytes());

    let states: Vec<Result<Node, String>> = nodes
        .iter()
        .map(|url| probe(url, &names, timeout).map_err(|e| e.to_string()))
        .collect();
    let quorum = nodes.len() / 2 + 1;
    println!("key {key:?} on {} nodes (quorum {quorum})", nodes.len());
    for (i, (url, state)) in nodes.iter().zip(&states).enumerate() {
        let node = match state {
            Ok(node) => node,
            Err(why) => {
                println!("node {i}  {url}  unreachable: {why}");
                continue;
            }
        };
        println!("node {i}  {url}  reachable");
        println!("  mutex    {}", slot(&node.mutex));
        println!("  writer   {}", slot(&node.writer));
        println!("  readers  {}", members(&node.readers));
        println!("  intents  {}", members(&node.intents));
        println!("  queue    {} waiting", node.queue);
    }

    let up: Vec<&Node> = states.iter().filter_map(|s| s.as_ref().ok()).collect();
    println!(
        "summary: {}/{} nodes reachable (quorum {quorum})",
        up.len(),
        nodes.len()
    );
    if up.len() < quorum {
        println!("  unknown: fewer than a quorum of nodes answered");
        return Ok(0);
    }
    println!(
        "  mutex:   {}",
        slot_summary(&up, |n| &n.mutex, nodes.len(), quorum)
    );
    println!(
        "  writer:  {}",
        slot_summary(&up, |n| &n.writer, nodes.len(), quorum)
    );
    let readers = on_quorum(&up, |n| &n.readers, quorum);
    match readers.len() {
        0 => println!("  readers: none on a quorum"),
        k => println!(
            "  readers: {k} on a quorum ({}), the read lock is held",
            readers.join(", ")
        ),
    }
    let intents = on_quorum(&up, |n| &n.intents, quorum);
    println!("  intents: {} writer(s) waiting on a quorum", intents.len());
    // The length a quorum agrees on at least: the quorum-th longest queue.
    let mut lengths: Vec<usize> = up.iter().map(|n| n.queue).collect();
    lengths.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "  queue:   {} waiting on a quorum (longest {})",
        lengths[quorum - 1],
        lengths[0]
    );
    Ok(0)
}

/// Reads what one node holds for a resource.
fn probe(url: &str, names: &Names, timeout: Duration) -> io::Result<Node> {
    let mut conn = NodeConn::connect(url, timeout)?;
    let now_ms = match conn.call_ok(&[b"TIME"])? {
        Value::Array(Some(parts)) => match parts.as_slice() {
            [Value::Bulk(Some(s)), Value::Bulk(Some(us))] => {
                number(s).saturating_mul(1000) + number(us) / 1000
            }
            _ => return Err(io::Error::other("TIME answered oddly")),
        },
        _ => return Err(io::Error::other("TIME answered oddly")),
    };
    let now = now_ms.to_string();
    // The queue entries' expiries are node-clock ms too; count those still ahead, in the
    // mutex's queue and the read-write lock's.
    let mut queue = 0;
    for expiries in [&names.mutex_queue_expiries, &names.rw_queue_expiries] {
        if let Ok(Value::Integer(n)) = conn.call_ok(&[b"ZCOUNT", expiries, now.as_bytes(), b"+inf"])
        {
            queue += n.max(0) as usize;
        }
    }
    Ok(Node {
        mutex: string_slot(&mut conn, &names.mutex)?,
        writer: string_slot(&mut conn, &names.writer)?,
        readers: scored(&mut conn, &names.readers, now_ms)?,
        intents: scored(&mut conn, &names.intents, now_ms)?,
        queue,
    })
}

fn number(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .map_or(0, |f| f as i64)
}

fn string_slot(conn: &mut NodeConn, key: &[u8]) -> io::Result<Slot> {
    let kind = match conn.call_ok(&[b"TYPE", key])? {
        Value::Simple(t) => String::from_utf8_lossy(&t).into_owned(),
        _ => "unknown".into(),
    };
    match kind.as_str() {
        "none" => Ok(Slot::Free),
        "string" => {
            let token = match conn.call_ok(&[b"GET", key])? {
                Value::Bulk(Some(token)) => token,
                _ => return Ok(Slot::Free),
            };
            let pttl_ms = match conn.call_ok(&[b"PTTL", key])? {
                Value::Integer(n) => n,
                _ => -1,
            };
            Ok(Slot::Held { token, pttl_ms })
        }
        _ => Ok(Slot::Other { kind }),
    }
}

/// The members of a sorted set scored by node-clock expiry, soonest to expire first.
fn scored(conn: &mut NodeConn, key: &[u8], now_ms: i64) -> io::Result<Vec<Member>> {
    let flat = match conn.call(&[b"ZRANGE", key, b"0", b"-1", b"WITHSCORES"])? {
        Value::Array(Some(flat)) => flat,
        // WRONGTYPE and the like: not a set the library made.
        _ => return Ok(Vec::new()),
    };
    Ok(flat
        .chunks(2)
        .filter_map(|pair| match pair {
            [Value::Bulk(Some(token)), Value::Bulk(Some(score))] => Some(Member {
                token: token.clone(),
                left_ms: number(score) - now_ms,
            }),
            _ => None,
        })
        .collect())
}

fn slot(s: &Slot) -> String {
    match s {
        Slot::Free => "-".into(),
        Slot::Held { token, pttl_ms } => format!("{} pttl {}", prefix(token), pttl(*pttl_ms)),
        Slot::Other { kind } => format!("(a key of type {kind}, not a lock)"),
    }
}

fn members(set: &[Member]) -> String {
    let live: Vec<&Member> = Node::live(set).collect();
    let expired = set.len() - live.len();
    let mut out = live.len().to_string();
    for (i, m) in live.iter().enumerate() {
        if i == LISTED {
            out.push_str(&format!(", and {} more", live.len() - LISTED));
            break;
        }
        out.push_str(if i == 0 { ": " } else { ", " });
        out.push_str(&format!("{} {}ms", prefix(&m.token), m.left_ms));
    }
    if expired > 0 {
        out.push_str(&format!(" (+{expired} expired, not yet pruned)"));
    }
    out
}

/// The token on the most nodes, on how many, and its shortest PTTL there.
fn slot_summary(up: &[&Node], get: fn(&Node) -> &Slot, nodes: usize, quorum: usize) -> String {
    let mut best: Option<(&[u8], usize, i64)> = None;
    for n in up {
        if let Slot::Held { token, .. } = get(n) {
            let pttls: Vec<i64> = up
                .iter()
                .filter_map(|o| match get(o) {
                    Slot::Held { token: t, pttl_ms } if t == token => Some(*pttl_ms),
                    _ => None,
                })
                .collect();
            let min_pttl = pttls.iter().copied().min().unwrap_or(0);
            if best.is_none_or(|(_, on, _)| pttls.len() > on) {
                best = Some((token, pttls.len(), min_pttl));
            }
        }
    }
    match best {
        Some((token, on, min_pttl)) if on >= quorum => format!(
            "HELD by {} on {on}/{nodes} nodes, expires in {} at the earliest",
            prefix(token),
            pttl(min_pttl)
        ),
        Some((token, on, _)) => format!(
            "not held on a quorum: {} holds {on}/{nodes} nodes",
            prefix(token)
        ),
        None => "FREE on a quorum".into(),
    }
}

/// The live members found on at least `quorum` nodes, as token prefixes.
fn on_quorum(up: &[&Node], set: fn(&Node) -> &[Member], quorum: usize) -> Vec<String> {
    let mut seen: Vec<(&[u8], usize)> = Vec::new();
    for n in up {
        for m in Node::live(set(n)) {
            match seen.iter_mut().find(|(t, _)| *t == m.token.as_slice()) {
                Some((_, count)) => *count += 1,
                None => seen.push((&m.token, 1)),
            }
        }
    }
    seen.into_iter()
        .filter(|&(_, count)| count >= quorum)
        .map(|(t, _)| prefix(t))
        .collect()
}

fn prefix(token: &[u8]) -> String {
    let shown = &token[..token.len().min(TOKEN_PREFIX)];
    let mut s = String::from_utf8_lossy(shown).into_owned();
    if token.len() > TOKEN_PREFIX {
        s.push('…');
    }
    s
}

fn pttl(ms: i64) -> String {
    match ms {
        -1 => "no expiry".into(),
        -2 => "-".into(),
        ms => format!("{ms}ms"),
    }
}
