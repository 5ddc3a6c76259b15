//! `redlock-mux inspect`: what each node holds for a key, and what that means for the quorum.
//!
//! For a key `K` it reads, on every node, the three things the library may keep for it: the
//! mutex (`K` itself), the read-write lock (writer key, reader set and writer intents, named
//! as [`redlock_mux::Client::read_lock`] documents) and the fair queues. Reader and intent
//! expiries are scores on the node's own clock, so they are compared with that node's `TIME`.
//!
//! URLs are read by the library's parser ([`redlock_mux::NodeUrl`]) and shown without their
//! passwords. A Sentinel-managed node is read on the master its sentinels name; a Redis Cluster
//! node on the masters its seed's `MOVED` replies name (a lock's keys may sit in several slots).
//!
//! It also shows how each node looks to the library: for each node it builds a one-node
//! [`Client`], sends [`PROBE_ROUNDS`] probe rounds through it and prints that client's
//! statistics ([`Client::stats`]): the node's reply latency and failures. One client per node,
//! because a round over all the nodes returns at the quorum and would never time the slowest
//! node; a one-node round waits for its node's reply. A probe is [`Client::resume_lock`] of
//! [`PROBE_KEY`] with [`PROBE_TOKEN`]: an extend round that renews the key only where it holds
//! that token. No grant ever carries an all-zero token (tokens are 160 random bits), so the
//! node refuses and nothing is written: the probe cannot disturb anyone's locks, not even on
//! the key inspected, and needs no cleanup.

use std::io::{self, Write};
use std::time::Duration;

use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, KeyNames as Names, NodeStats, NodeUrl};
use serde_json::json;

use crate::args::{self, usage};
use crate::lock::EXIT_CONFIG;
use crate::node::{Failure, NodeConn, ServerInfo};
use crate::stats::Fixed;
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux inspect [OPTIONS] KEY

Shows, for each node, whether it is reachable, the prefix of the mutex
holder's token and of the read-write lock's writer's token with their PTTL,
the readers and waiting writers (write intents) with their remaining ms, and
the length of the fair queues, and which server it runs (name and version, from
INFO server). It ends with a summary over the quorum, and
what the library sees of each node: the reply latency (p50, p99) and the
failures of a few probe rounds sent through a library client. A probe
checks a token no lock has, on a key of its own, so nothing is written.
Passwords in node URLs are shown as ***.

Options:
  --nodes URLS   comma-separated node URLs (default: $REDLOCK_NODES)
  --timeout D    connect and read timeout per node (default 1s)
  --json         print it all as one JSON object
{TLS}  -h, --help     this text

Exit status:
  0    a quorum of nodes answered, and every node that answered is Redis
  69   fewer than a quorum of nodes answered (what they hold is not known)
  78   a node refused the connection setup or a command (wrong password or
       user, a database it does not have, missing permissions, a TLS
       certificate that does not verify), or is not a Redis server
  64   usage error
";

/// Exit status when fewer than a quorum of nodes answered (sysexits `EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: i32 = 69;

/// Characters of a token shown: enough to tell holders apart, not enough to forge a release.
const TOKEN_PREFIX: usize = 12;
/// Readers or intents listed per node in the text; the rest are counted.
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
    /// What `INFO server` says the node runs.
    server: Option<ServerInfo>,
    mutex: Slot,
    writer: Slot,
    readers: Vec<Member>,
    intents: Vec<Member>,
    /// Live entries of the fair queues (those whose expiry is still ahead).
    queue: usize,
}

impl Node {
    fn live(set: &[Member]) -> impl Iterator<Item = &Member> {
        set.iter().filter(|m| m.left_ms > 0)
    }
}

/// What a quorum agrees a string slot holds.
enum SlotSummary<'a> {
    /// The same token on at least a quorum; the shortest PTTL among them.
    Held {
        token: &'a [u8],
        on: usize,
        pttl_ms: i64,
    },
    /// A token on the most nodes, but fewer than a quorum.
    Split {
        token: &'a [u8],
        on: usize,
    },
    Free,
}

/// The key the probe rounds check: its own, so that no user's lock is touched.
pub const PROBE_KEY: &str = "redlock-mux:inspect:probe";
/// The token the probe rounds check for: a token's shape, but no grant ever has it.
pub const PROBE_TOKEN: &str = "0000000000000000000000000000000000000000";
/// How many probe rounds go to each node: a few, for a median and a 99th percentile.
pub const PROBE_ROUNDS: usize = 3;

/// What the probe rounds through one node's library client showed.
struct Probe {
    /// The node's statistics in its client after the rounds, or why no client was built.
    stats: Result<NodeStats, Error>,
    /// Rounds the node answered (refused, as expected).
    answered: usize,
}

/// Everything `inspect` found.
struct Report {
    key: String,
    urls: Vec<NodeUrl>,
    states: Vec<Result<Node, Failure>>,
    quorum: usize,
    probes: Vec<Probe>,
}

/// Entry point of `redlock-mux inspect`.
pub fn main(argv: Vec<std::ffi::OsString>) -> Result<i32, Fail> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(argv);
    let (mut key, mut nodes) = (None, None);
    let mut timeout = Duration::from_secs(1);
    let mut json = false;
    let mut tls = args::TlsFiles::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long(name) if args::TlsFiles::takes(name) => {
                let name = name.to_owned();
                tls.set(&name, parser.value()?);
            }
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("timeout") => timeout = args::duration("--timeout", parser.value()?)?,
            Long("json") => json = true,
            Short('h') | Long("help") => {
                return crate::print_text(&HELP.replace("{TLS}", args::TLS_HELP))
            }
            Value(value) if key.is_none() => key = Some(args::text("KEY", value)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let key = key.ok_or_else(|| usage!("no KEY given"))?;
    tls.check()?;
    let raw = args::nodes(nodes)?;
    let urls = raw
        .iter()
        .map(|url| NodeUrl::parse(url).map_err(|e| usage!("{e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if timeout.is_zero() {
        return Err(usage!("--timeout: must be more than zero").into());
    }
    let names = Names::new(key.as_bytes());
    let states = urls
        .iter()
        .map(|url| probe(url, &tls, &names, timeout))
        .collect();
    let report = Report {
        quorum: urls.len() / 2 + 1,
        probes: raw
            .iter()
            .map(|url| probe_client(url, &tls, timeout))
            .collect(),
        key,
        urls,
        states,
    };
    let code = report.exit_code();
    let mut out = io::stdout().lock();
    if json {
        writeln!(out, "{}", report.json(code))?;
    } else {
        report.text(&mut out)?;
    }
    out.flush()?;
    Ok(code)
}

impl Report {
    fn up(&self) -> Vec<&Node> {
        self.states.iter().filter_map(|s| s.as_ref().ok()).collect()
    }

    /// 78 when a node refused or is not Redis, 69 without a quorum, else 0.
    fn exit_code(&self) -> i32 {
        let misconfigured = self
            .states
            .iter()
            .any(|s| matches!(s, Err(Failure::Refused(_) | Failure::NotRedis(_))));
        if misconfigured {
            EXIT_CONFIG
        } else if self.up().len() < self.quorum {
            EXIT_UNAVAILABLE
        } else {
            0
        }
    }

    fn text(&self, out: &mut impl Write) -> io::Result<()> {
        let (n, quorum) = (self.urls.len(), self.quorum);
        writeln!(out, "key {:?} on {n} nodes (quorum {quorum})", self.key)?;
        for (i, (url, state)) in self.urls.iter().zip(&self.states).enumerate() {
            let node = match state {
                Ok(node) => node,
                Err(why) => {
                    writeln!(out, "node {i}  {url}  {why}")?;
                    continue;
                }
            };
            match &node.server {
                Some(server) => writeln!(out, "node {i}  {url}  reachable, {server}")?,
                None => writeln!(out, "node {i}  {url}  reachable")?,
            }
            writeln!(out, "  mutex    {}", slot(&node.mutex))?;
            writeln!(out, "  writer   {}", slot(&node.writer))?;
            writeln!(out, "  readers  {}", members(&node.readers))?;
            writeln!(out, "  intents  {}", members(&node.intents))?;
            writeln!(out, "  queue    {} waiting", node.queue)?;
        }
        let up = self.up();
        writeln!(
            out,
            "summary: {}/{n} nodes reachable (quorum {quorum})",
            up.len()
        )?;
        if up.len() < quorum {
            writeln!(out, "  unknown: fewer than a quorum of nodes answered")?;
            return self.probe_text(out);
        }
        for (name, get) in [
            ("mutex:  ", mutex_of as fn(&Node) -> &Slot),
            ("writer: ", writer_of),
        ] {
            let line = match slot_summary(&up, get, quorum) {
                SlotSummary::Held { token, on, pttl_ms } => format!(
                    "HELD by {} on {on}/{n} nodes, expires in {} at the earliest",
                    prefix(token),
                    pttl(pttl_ms)
                ),
                SlotSummary::Split { token, on } => format!(
                    "not held on a quorum: {} holds {on}/{n} nodes",
                    prefix(token)
                ),
                SlotSummary::Free => "FREE on a quorum".into(),
            };
            writeln!(out, "  {name} {line}")?;
        }
        let readers = on_quorum(&up, |n| &n.readers, quorum);
        match readers.len() {
            0 => writeln!(out, "  readers: none on a quorum")?,
            k => writeln!(
                out,
                "  readers: {k} on a quorum ({}), the read lock is held",
                readers.join(", ")
            )?,
        }
        let intents = on_quorum(&up, |n| &n.intents, quorum);
        writeln!(
            out,
            "  intents: {} writer(s) waiting on a quorum",
            intents.len()
        )?;
        let (agreed, longest) = queue_lengths(&up, quorum);
        writeln!(
            out,
            "  queue:   {agreed} waiting on a quorum (longest {longest})"
        )?;
        self.probe_text(out)
    }

    /// Each node as the library sees it, after the probe rounds.
    fn probe_text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "library client: {PROBE_ROUNDS} probe rounds per node (nothing written)"
        )?;
        for (i, probe) in self.probes.iter().enumerate() {
            let node = match &probe.stats {
                Ok(node) => node,
                Err(e) => {
                    writeln!(out, "  node {i}  no client: {e}")?;
                    continue;
                }
            };
            let ms = |d: Option<Duration>| {
                d.map_or("-".to_owned(), |d| {
                    format!("{:.3}ms", Fixed(d.as_secs_f64() * 1e3))
                })
            };
            let f = &node.failures;
            let mut failures = String::new();
            for (name, count) in [
                ("timeout", f.timeout),
                ("connect", f.connect),
                ("backoff", f.backoff),
                ("io", f.io),
                ("protocol", f.protocol),
                ("server", f.server),
                ("unexpected-reply", f.unexpected_reply),
                ("setup", f.setup),
            ] {
                if count > 0 {
                    failures.push_str(&format!(" {name} {count}"));
                }
            }
            writeln!(
                out,
                "  node {i}  latency p50 {} p99 {} over {} replies, {} failures{}",
                ms(node.latency_p50),
                ms(node.latency_p99),
                node.latency_samples,
                f.total(),
                if failures.is_empty() {
                    String::new()
                } else {
                    format!(":{failures}")
                }
            )?;
        }
        Ok(())
    }

    fn json(&self, code: i32) -> serde_json::Value {
        let nodes: Vec<serde_json::Value> = self
            .urls
            .iter()
            .zip(&self.states)
            .enumerate()
            .map(|(i, (url, state))| match state {
                Ok(node) => json!({
                    "node": i,
                    "url": url.to_string(),
                    "state": "reachable",
                    "server": node.server.as_ref().map(|s| json!({
                        "name": s.name, "version": s.version,
                    })),
                    "mutex": slot_json(&node.mutex),
                    "writer": slot_json(&node.writer),
                    "readers": members_json(&node.readers),
                    "intents": members_json(&node.intents),
                    "queue": node.queue,
                }),
                Err(why) => json!({
                    "node": i,
                    "url": url.to_string(),
                    "state": match why {
                        Failure::Unreachable(_) => "unreachable",
                        Failure::Refused(_) => "refused",
                        Failure::NotRedis(_) => "not-redis",
                    },
                    "error": why.to_string(),
                }),
            })
            .collect();
        let up = self.up();
        let summary = if up.len() < self.quorum {
            serde_json::Value::Null
        } else {
            let slot = |get| match slot_summary(&up, get, self.quorum) {
                SlotSummary::Held { token, on, pttl_ms } => json!({
                    "state": "held", "token_prefix": prefix(token), "on": on, "pttl_ms": pttl_ms,
                }),
                SlotSummary::Split { token, on } => json!({
                    "state": "split", "token_prefix": prefix(token), "on": on,
                }),
                SlotSummary::Free => json!({ "state": "free" }),
            };
            let (agreed, longest) = queue_lengths(&up, self.quorum);
            json!({
                "mutex": slot(mutex_of),
                "writer": slot(writer_of),
                "readers": on_quorum(&up, |n| &n.readers, self.quorum),
                "intents": on_quorum(&up, |n| &n.intents, self.quorum),
                "queue": agreed,
                "queue_longest": longest,
            })
        };
        json!({
            "key": self.key,
            "nodes": nodes,
            "quorum": self.quorum,
            "reachable": up.len(),
            "summary": summary,
            "client": json!({
                "probe_rounds": PROBE_ROUNDS,
                "nodes": self.probes.iter().enumerate().map(|(i, p)| match &p.stats {
                    Ok(stats) => {
                        let mut node = crate::bench::node_stats_json(stats);
                        node["node"] = json!(i);
                        node["answered"] = json!(p.answered);
                        node
                    }
                    Err(e) => json!({ "node": i, "error": e.to_string() }),
                }).collect::<Vec<_>>(),
            }),
            "exit_status": code,
        })
    }
}

/// Builds a one-node library client for `url` and sends the probe rounds through it (see the
/// module's documentation).
fn probe_client(url: &str, tls: &args::TlsFiles, timeout: Duration) -> Probe {
    let client = tls
        .apply(Client::builder())
        .nodes([url])
        .node_timeout(timeout)
        .connect_timeout(timeout)
        .build();
    let client = match client {
        Ok(client) => client,
        Err(e) => {
            return Probe {
                stats: Err(e),
                answered: 0,
            }
        }
    };
    let mut answered = 0;
    for _ in 0..PROBE_ROUNDS {
        match client.resume_lock(PROBE_KEY, PROBE_TOKEN, Duration::from_millis(100)) {
            Err(Error::Contended { .. }) => answered += 1,
            // Only if someone took the probe key with the all-zero token, which the library
            // never does: give it back.
            Ok(lock) => {
                let _ = lock.release();
            }
            Err(_) => {}
        }
    }
    Probe {
        stats: Ok(client.stats().nodes.swap_remove(0)),
        answered,
    }
}

fn mutex_of(n: &Node) -> &Slot {
    &n.mutex
}

fn writer_of(n: &Node) -> &Slot {
    &n.writer
}

/// Reads what one node holds for a resource.
/// The master the sentinels of `url` name for `service`: the first of them that answers with
/// one is believed; it must say it is a master. A failure says what failed, naming the service
/// and the sentinels asked (and the master, when it is the master's): no sentinel could be
/// reached (unreachable), the sentinels refused the credentials or do not know the service
/// (refused), the master named could not be reached or is not a master.
fn sentinel_master(
    url: &NodeUrl,
    service: &str,
    tls: &args::TlsFiles,
    timeout: Duration,
) -> Result<NodeUrl, Failure> {
    let sentinels = url.sentinels();
    let asked: Vec<String> = sentinels
        .iter()
        .map(|s| s.addr().map_or_else(|| s.to_string(), |a| a.to_string()))
        .collect();
    let asked = asked.join(", ");
    // The last failure of a sentinel that answered (credentials refused, service unknown),
    // and of one that could not be reached.
    let mut refused: Option<String> = None;
    let mut unreachable: Option<io::Error> = None;
    for sentinel in sentinels {
        let answer = NodeConn::connect(&sentinel, tls, timeout).and_then(|mut conn| {
            conn.call_ok(&[b"SENTINEL", b"get-master-addr-by-name", service.as_bytes()])
        });
        let named = match answer {
            Ok(Value::Array(Some(parts))) => match parts.as_slice() {
                [Value::Bulk(Some(host)), Value::Bulk(Some(port))] => {
                    let host = String::from_utf8_lossy(host).into_owned();
                    let port = String::from_utf8_lossy(port).into_owned();
                    std::net::ToSocketAddrs::to_socket_addrs(&(
                        host.as_str(),
                        number(port.as_bytes()) as u16,
                    ))
                    .ok()
                    .and_then(|mut a| a.next())
                    .and_then(|addr| url.sentinel_master(addr, &host))
                }
                _ => None,
            },
            Ok(_) => {
                refused = Some(format!(
                    "the sentinel does not know the service {service:?}"
                ));
                None
            }
            Err(Failure::Unreachable(e)) => {
                unreachable = Some(e);
                continue;
            }
            Err(Failure::Refused(e) | Failure::NotRedis(e)) => {
                refused = Some(e);
                continue;
            }
        };
        let Some(master) = named else {
            continue;
        };
        let named_by = format!("the master of {service:?} named by {asked}");
        let mut conn = NodeConn::connect(&master, tls, timeout).map_err(|e| match e {
            Failure::Unreachable(e) => Failure::Unreachable(io::Error::new(
                e.kind(),
                format!("{master}, {named_by}, could not be reached: {e}"),
            )),
            Failure::Refused(e) => Failure::Refused(format!("{master}, {named_by}: {e}")),
            Failure::NotRedis(e) => Failure::NotRedis(format!("{master}, {named_by}: {e}")),
        })?;
        return match conn.call_ok(&[b"ROLE"])? {
            Value::Array(Some(parts)) if matches!(parts.first(), Some(Value::Bulk(Some(r))) if r == b"master") => {
                Ok(master)
            }
            _ => Err(Failure::Refused(format!(
                "{master}, {named_by}, is not a master"
            ))),
        };
    }
    // Every sentinel that could be reached refused: the URL is wrong; else none could be.
    match (refused, unreachable) {
        (Some(why), _) => Err(Failure::Refused(format!(
            "{why} (asked {asked} for the service {service:?})"
        ))),
        (None, Some(e)) => Err(Failure::Unreachable(io::Error::new(
            e.kind(),
            format!("no sentinel of the service {service:?} could be reached (tried {asked}): {e}"),
        ))),
        (None, None) => Err(Failure::Refused(format!(
            "no sentinel knows the service {service:?} (asked {asked})"
        ))),
    }
}

fn probe(
    url: &NodeUrl,
    tls: &args::TlsFiles,
    names: &Names,
    timeout: Duration,
) -> Result<Node, Failure> {
    let master;
    let url = match url.sentinel_service() {
        Some(service) => {
            master = sentinel_master(url, service, tls, timeout)?;
            &master
        }
        None => url,
    };
    let mut conn = NodeConn::connect(url, tls, timeout)?;
    let server = conn.server()?;
    let odd = |what: &str| Failure::NotRedis(format!("{what} answered as Redis does not"));
    let now_ms = match conn.call_ok(&[b"TIME"])? {
        Value::Array(Some(parts)) => match parts.as_slice() {
            [Value::Bulk(Some(s)), Value::Bulk(Some(us))] => {
                number(s).saturating_mul(1000) + number(us) / 1000
            }
            _ => return Err(odd("TIME")),
        },
        _ => return Err(odd("TIME")),
    };
    let now = now_ms.to_string();
    // The queue entries' expiries are node-clock ms too; count those still ahead, in the
    // mutex's queue and the read-write lock's.
    let mut queue = 0;
    for expiries in [&names.mutex_queue_expiries, &names.rw_queue_expiries] {
        if let Value::Integer(n) = conn.call(&[b"ZCOUNT", expiries, now.as_bytes(), b"+inf"])? {
            queue += n.max(0) as usize;
        }
    }
    // On Redis 8 the read-preferring lock keeps its readers as fields of a hash at the writer
    // key, each with its own expiry; readers in the set come from the other paths.
    let mut writer = string_slot(&mut conn, &names.writer)?;
    let mut readers = scored(&mut conn, &names.readers, now_ms)?;
    if matches!(&writer, Slot::Other { kind } if kind == "hash") {
        writer = Slot::Free;
        // The set's members come in score order, soonest to expire first; each field goes in
        // its place, after those that expire no later (an insertion: no sort of its own).
        for reader in hash_readers(&mut conn, &names.writer)? {
            let at = readers.partition_point(|m| m.left_ms <= reader.left_ms);
            readers.insert(at, reader);
        }
    }
    Ok(Node {
        server,
        mutex: string_slot(&mut conn, &names.mutex)?,
        writer,
        readers,
        intents: scored(&mut conn, &names.intents, now_ms)?,
        queue,
    })
}

/// A number a server sent (a port, `TIME`'s parts, a sorted set's score), truncated toward zero
/// to an integer: `-12`, `1732800000000`, `1.7328e+12` (how Redis 7.2 and later may write a
/// score), `12.5`; 0 for what is not a number. Integer arithmetic only: parsing a float would
/// bring the standard library's decimal-to-float tables into the small command.
fn number(bytes: &[u8]) -> i64 {
    let text = std::str::from_utf8(bytes).unwrap_or("").trim();
    let (negative, text) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => match text[at + 1..].parse::<i32>() {
            Ok(e) => (&text[..at], e),
            Err(_) => return 0,
        },
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = || whole.bytes().chain(fraction.bytes());
    if whole.len() + fraction.len() == 0 || !digits().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    // The digits as one integer, and the power of ten that scales it; beyond i64 it saturates.
    let mut value: i128 = 0;
    let mut scale = i64::from(exponent) - fraction.len() as i64;
    for d in digits() {
        if value > i128::from(i64::MAX) {
            scale += 1;
        } else {
            value = value * 10 + i128::from(d - b'0');
        }
    }
    while scale > 0 && value != 0 && value <= i128::from(i64::MAX) {
        value *= 10;
        scale -= 1;
    }
    while scale < 0 && value != 0 {
        value /= 10;
        scale += 1;
    }
    let value = i64::try_from(value).unwrap_or(i64::MAX);
    if negative {
        -value
    } else {
        value
    }
}

fn string_slot(conn: &mut NodeConn, key: &[u8]) -> Result<Slot, Failure> {
    let kind = match conn.call_ok(&[b"TYPE", key])? {
        Value::Simple(t) => String::from_utf8_lossy(&t).into_owned(),
        _ => return Err(Failure::NotRedis("TYPE answered as Redis does not".into())),
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

/// The fields of a hash whose fields expire on their own (Redis 8 readers), with the ms each has
/// left (`HPTTL`); a field without an expiry counts as not expiring.
fn hash_readers(conn: &mut NodeConn, key: &[u8]) -> Result<Vec<Member>, Failure> {
    let fields = match conn.call(&[b"HKEYS", key])? {
        Value::Array(Some(fields)) => fields,
        _ => return Ok(Vec::new()),
    };
    let mut readers = Vec::with_capacity(fields.len());
    for field in fields {
        let Value::Bulk(Some(token)) = field else {
            continue;
        };
        let left_ms = match conn.call(&[b"HPTTL", key, b"FIELDS", b"1", &token])? {
            Value::Array(Some(v)) => match v.first() {
                Some(Value::Integer(ms)) if *ms >= 0 => *ms,
                Some(Value::Integer(-1)) => i64::MAX,
                _ => continue,
            },
            _ => continue,
        };
        readers.push(Member { token, left_ms });
    }
    Ok(readers)
}

/// The members of a sorted set scored by node-clock expiry, soonest to expire first.
fn scored(conn: &mut NodeConn, key: &[u8], now_ms: i64) -> Result<Vec<Member>, Failure> {
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

fn slot_json(s: &Slot) -> serde_json::Value {
    match s {
        Slot::Free => json!({ "state": "free" }),
        Slot::Held { token, pttl_ms } => {
            json!({ "state": "held", "token_prefix": prefix(token), "pttl_ms": pttl_ms })
        }
        Slot::Other { kind } => json!({ "state": "other", "type": kind }),
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

fn members_json(set: &[Member]) -> serde_json::Value {
    let live: Vec<serde_json::Value> = Node::live(set)
        .map(|m| json!({ "token_prefix": prefix(&m.token), "left_ms": m.left_ms }))
        .collect();
    json!({ "live": live, "expired": set.len() - Node::live(set).count() })
}

/// The token on the most nodes, on how many, and its shortest PTTL there.
fn slot_summary<'a>(up: &[&'a Node], get: fn(&Node) -> &Slot, quorum: usize) -> SlotSummary<'a> {
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
        Some((token, on, pttl_ms)) if on >= quorum => SlotSummary::Held { token, on, pttl_ms },
        Some((token, on, _)) => SlotSummary::Split { token, on },
        None => SlotSummary::Free,
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

/// The queue length a quorum agrees on at least (the quorum-th longest), and the longest.
fn queue_lengths(up: &[&Node], quorum: usize) -> (usize, usize) {
    let mut lengths: Vec<usize> = up.iter().map(|n| n.queue).collect();
    lengths.sort_unstable();
    (
        lengths.len().checked_sub(quorum).map_or(0, |i| lengths[i]),
        lengths.last().copied().unwrap_or(0),
    )
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

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn numbers_as_servers_write_them() {
        for (text, n) in [
            ("0", 0),
            ("6379", 6379),
            ("-12", -12),
            ("+7", 7),
            (" 42 ", 42),
            ("1732800000000", 1_732_800_000_000),
            ("1.7328e+12", 1_732_800_000_000),
            ("1.7328E12", 1_732_800_000_000),
            ("17328e8", 1_732_800_000_000),
            ("12.5", 12),
            ("-12.9", -12),
            ("1e-3", 0),
            ("1732800000123.75", 1_732_800_000_123),
            ("99999999999999999999999", i64::MAX),
            ("1e400", i64::MAX),
            ("", 0),
            ("-", 0),
            (".", 0),
            ("inf", 0),
            ("nan", 0),
            ("1e", 0),
            ("1.2.3", 0),
            ("12ab", 0),
        ] {
            assert_eq!(number(text.as_bytes()), n, "{text:?}");
        }
    }
}
