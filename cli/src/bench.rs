//! `redlock-mux bench`: lock latency against given nodes or local `redis-server` processes it
//! starts, next to a baseline measured in the same run.
//!
//! - `mutex`: the mutex next to the raw baseline ([`crate::raw`]), the least a Redlock client
//!   can do on the wire: `SET key token NX PX ttl` written to all N blocking sockets, then all N
//!   replies read; release by a compare-and-delete script sent the same way.
//! - `read`, `write`: read and write locks next to `rawQ-rw` ([`crate::raw::RawQRw`], the ideal
//!   client of the read-write lock design: its scripts by `EVALSHA` to all N sockets at once,
//!   returning at the quorum) and to the library's own mutex.
//! - `semaphore`: a semaphore of 2 permits (its quorum is 4 of 5 nodes) next to the mutex.
//! - `handoff`: threads contending for one lock, each holding it for 1 ms; the figure is the
//!   gap from one thread's release to another's acquire.
//! - `threads`: T threads on distinct keys, sharing one client, next to `rawN` (the raw
//!   baseline with a connection set per thread, returning at the quorum); for each T and each
//!   client, timed cells of a few seconds: aggregate operations per second, acquire and cycle
//!   latency, failed calls, connections per node and server CPU per cycle (both from the
//!   servers themselves: `CLIENT LIST`, `INFO cpu`).
//!
//! Whatever is compared runs in alternating blocks, so a change in machine load during the
//! run hits both alike; their ratio is the figure to watch.
//!
//! Output goes through one writer, so a reader that goes away (`bench | head`) ends the
//! command quietly.

use std::collections::BTreeMap;
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Client, Error, NodeUrl};
use serde_json::json;

use crate::args::{self, usage, NodesFrom};
use crate::local_servers::RedisCluster;
use crate::raw::{raw_cycle, Connections, Probe, Raw, RawQRw, Side, Target, Tokens};
use crate::stats::{failure_kind, fmt_duration, ratio, us, Samples, Summary};
use crate::Fail;

#[cfg(feature = "tls")]
mod tls;

const HELP: &str = "\
Usage: redlock-mux bench [--nodes URLS | --instances N [--server PATH]] [--iters N]
                         [--mode mutex|read|write|semaphore|downgrade|handoff|threads|all]
                         [--threads T,T,...] [--duration D] [--rounds R]
                         [--json]
       redlock-mux bench --tls [--instances N] [--server PATH] [--iters N] [--json]

Measures lock latency: acquire, release and the whole cycle (p50, p90, p99,
p99.9, max), ops/s and a histogram.

Modes:
  mutex     (default) the mutex next to a raw baseline (SET NX PX to all N
            sockets, then all N replies; release by compare-and-delete), in
            alternating blocks, at N = 1, 3 and 5
  read      read locks next to rawQ-rw (the read-write lock design's read
            acquire script by EVALSHA to all N sockets at once, returning at
            the quorum; release by ZREM and an announcement) and to the mutex,
            in rotating blocks, at the largest N (5 by default)
  write     write locks likewise (the design's write acquire script; release by
            compare-and-delete)
  semaphore permits of a 2-permit semaphore next to the mutex, in rotating
            blocks, at N = 1, 3 and 5 (its quorum is floor(2N/3)+1: 4 of 5
            nodes, where the mutex needs 3)
  downgrade a write lock's downgrade to a read lock next to a mutex extend
            (each one round on held locks), in alternating blocks, at N = 1,
            3 and 5
  handoff   contended hand-off at the largest N: 2, then 8 threads loop lock,
            hold 1 ms, release for 3 s each; the figure is the gap from one
            thread starting its release to another's lock returning. Measured
            with plain and with fair (FIFO) clients
  threads   scale at the largest N: T threads loop try-lock + release on
            distinct keys (default T = 1, 4, 16 and 64), sharing one client,
            next to rawN: the raw baseline with a connection set per thread,
            returning at the quorum. Each cell runs --duration, the two in
            alternating order, --rounds times. Per T and client: ops/s (median
            of the rounds), acquire and cycle p50/p99, failed calls and why,
            connections per node and how many of them are pub/sub (CLIENT
            LIST, without the bench's own probe connection) and server CPU
            per cycle (INFO cpu, user + sys, summed over the nodes). A
            redis+cluster:// node is measured on each of its masters (CPU
            per cycle per master too), each thread spreads over 64 keys so
            that slots spread, and rawN is left out; the other modes refuse
            a cluster
  all       every mode above

TLS: with --tls (in a build with the `tls` feature), it starts N local servers
(default 5) that listen on a plaintext port and on a TLS port, with a
throw-away CA and server certificate made by the openssl command for the run,
and measures the mutex over TLS next to the mutex over plaintext, on the same
servers, in alternating blocks, at N = 1, 3 and 5: acquire and cycle p50 and
p99, and their ratios. The server binary must be built with TLS (Debian's
redis-server is).

Nodes: --nodes, else REDLOCK_NODES, names existing servers to use (the keys
it writes start with redlock-mux:bench:). Without either, or with
--instances, it starts N local redis-server processes (default 5) on free
loopback ports, with temporary directories and no persistence, and stops them
on exit; the output names the server and its version, as INFO server says.
The mutex, the semaphore and the downgrade are measured at N = 1, 3
and 5 (those not above the number of nodes, and the number of nodes itself), on
the first N nodes; read and write locks at the number of nodes.

Options:
  --nodes URLS      comma-separated node URLs of servers to use
                    (default: $REDLOCK_NODES)
  --instances N     start N local servers instead (default 5)
  --server PATH     the server binary --instances starts, such as a
                    valkey-server (default: $REDLOCK_MUX_REDIS_SERVER, else
                    redis-server on PATH)
  --tls             measure TLS against plaintext (see TLS above)
  --iters N         measured cycles per lock kind per N (default 20000; not
                    used by the threads mode, which is timed)
  --mode MODE       mutex, read, write, semaphore, downgrade, handoff, threads or all
                    (see above)
  --threads LIST    thread counts for the threads mode, e.g. 1,8,32; implies
                    --mode threads unless --mode is given
  --duration D      length of one threads-mode cell: seconds (0.5) or with a
                    unit (500ms, 3s); default 3s, at most 10m
  --rounds R        rounds of threads-mode cells (default 3, at most 100)
  --json            print every figure as one JSON object on stdout
  -h, --help        this text

A progress bar is drawn on stderr when it is a terminal.
";

/// Cycles between switches from one client or lock kind to the next.
const BLOCK: usize = 250;
/// TTL of benchmark locks: long enough never to expire during a cycle.
const TTL: Duration = Duration::from_secs(10);
/// How long each contending thread holds the lock in a hand-off.
const HANDOFF_HOLD: Duration = Duration::from_millis(1);
/// How long each hand-off configuration runs.
const HANDOFF_RUN: Duration = Duration::from_secs(3);
/// Grants in the first part of a hand-off run are not counted: connections for waiting
/// (subscriptions) open on first use.
const HANDOFF_WARMUP: Duration = Duration::from_millis(300);
/// Thread counts of the threads mode, unless given.
const THREADS: [usize; 4] = [1, 4, 16, 64];
/// Length of one threads-mode cell, unless given.
const CELL: Duration = Duration::from_secs(3);
/// Rounds of threads-mode cells, unless given.
const ROUNDS: usize = 3;
/// Most cycles one threads-mode cell records, whatever its length: bounds its memory.
const CELL_CAP: usize = 1_000_000;
/// Unmeasured cycles each thread runs first (connections open, scripts load).
const CELL_WARMUP: usize = 20;
/// Distinct failure messages kept per client and T; later ones are counted as "other".
const REASONS: usize = 8;
/// Contending threads in the hand-off runs.
const HANDOFF_THREADS: [usize; 2] = [2, 8];
/// The hand-off goals: p50 and p99 of the gap.
const HANDOFF_TARGET: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(3));
/// The read-write goal where the server runs no Lua for them (Redis 8.2 and later): read and
/// write within this factor of the mutex.
const RW_TARGET: f64 = 1.1;
/// The read-write goal on Redis 7, where both run a script: read and write within this factor of
/// `rawQ-rw`, the ideal client of the read-write design's scripts.
const RW_RAW_TARGET: f64 = 1.05;
/// The semaphore goal: its acquire within this factor of the mutex's.
const SEM_TARGET: f64 = 1.2;
/// The permits of the semaphore measured.
const SEM_PERMITS: u32 = 2;
/// The downgrade goal: its p50 within this factor of a mutex extend's.
const DOWNGRADE_TARGET: f64 = 1.2;

/// A lock kind measured against the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    Semaphore,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Semaphore => "semaphore",
        }
    }

    /// The goal: this kind's p50 within this factor of the mutex's.
    fn target(self) -> f64 {
        match self {
            Kind::Semaphore => SEM_TARGET,
            _ => RW_TARGET,
        }
    }

    /// The side of a read-write lock this kind is, for `rawQ-rw`; `None` for the kinds
    /// measured next to the mutex only.
    fn side(self) -> Option<Side> {
        match self {
            Kind::Read => Some(Side::Read),
            Kind::Write => Some(Side::Write),
            Kind::Mutex | Kind::Semaphore => None,
        }
    }
}

/// Entry point of `redlock-mux bench`.
pub fn main(argv: Vec<std::ffi::OsString>) -> Result<i32, Fail> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(argv);
    let (mut nodes, mut instances, mut mode) = (None, None, None);
    let mut iters = 20_000;
    let mut json = false;
    let mut thread_counts = None;
    let mut cell = CELL;
    let mut rounds = ROUNDS;
    let mut server: Option<std::path::PathBuf> = None;
    let mut tls = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("server") => server = Some(parser.value()?.into()),
            Long("tls") => tls = true,
            Long("instances") => instances = Some(args::count("--instances", parser.value()?)?),
            Long("iters") => iters = args::count("--iters", parser.value()?)?,
            Long("mode") => mode = Some(args::text("--mode", parser.value()?)?),
            Long("threads") => thread_counts = Some(counts(parser.value()?)?),
            Long("duration") => {
                cell = args::seconds("--duration", parser.value()?)?;
                if cell.is_zero() || cell > Duration::from_secs(600) {
                    return Err(usage!("--duration: from 1ms to 10m").into());
                }
            }
            Long("rounds") => {
                rounds = args::count("--rounds", parser.value()?)?;
                if rounds > 100 {
                    return Err(usage!("--rounds: at most 100").into());
                }
            }
            Long("json") => json = true,
            Short('h') | Long("help") => return crate::print_text(HELP),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let mode = mode.unwrap_or_else(|| {
        if thread_counts.is_some() {
            "threads"
        } else {
            "mutex"
        }
        .to_owned()
    });
    let (mutex, rw_kinds, handoff, scale): (bool, &[Kind], bool, bool) = match mode.as_str() {
        "mutex" => (true, &[], false, false),
        "read" => (false, &[Kind::Read], false, false),
        "write" => (false, &[Kind::Write], false, false),
        "semaphore" => (false, &[Kind::Semaphore], false, false),
        "downgrade" => (false, &[], false, false),
        "handoff" => (false, &[], true, false),
        "threads" => (false, &[], false, true),
        "all" => (
            true,
            &[Kind::Read, Kind::Write, Kind::Semaphore],
            true,
            true,
        ),
        other => return Err(usage!("--mode: unknown mode {other:?}").into()),
    };
    let downgrade = matches!(mode.as_str(), "downgrade" | "all");
    let thread_counts = thread_counts.unwrap_or_else(|| THREADS.to_vec());
    if nodes.is_some() && instances.is_some() {
        return Err(usage!("give either --nodes or --instances, not both").into());
    }
    if server.is_some() && nodes.is_some() {
        return Err(
            usage!("--server picks the binary --instances starts: not with --nodes").into(),
        );
    }
    if tls {
        if nodes.is_some() {
            return Err(
                usage!("--tls starts its own servers: give --instances, not --nodes").into(),
            );
        }
        let n = instances.unwrap_or(5);
        if n > redlock_mux::MAX_NODES {
            return Err(usage!("--instances: at most {}", redlock_mux::MAX_NODES).into());
        }
        let progress = Progress::new(io::stderr().is_terminal());
        #[cfg(feature = "tls")]
        return tls::run(server.as_deref(), n, iters, json, &progress);
        #[cfg(not(feature = "tls"))]
        {
            let _ = progress;
            return Err(usage!(
                "--tls: this redlock-mux was built without TLS (the `tls` feature)"
            )
            .into());
        }
    }
    let given = match instances {
        Some(_) => None,
        None if server.is_some() => None,
        None => args::nodes_or_none(nodes)?,
    };

    // Declared before the figures so the servers outlive every client using them.
    let cluster;
    let (urls, origin) = match given {
        Some((urls, from)) => {
            // Read with the library's parser now, for a usage error before anything runs.
            for url in &urls {
                let url = NodeUrl::parse(url).map_err(|e| usage!("{e}"))?;
                // The probes and baselines of the other modes address one server per URL;
                // the threads mode probes every master of a cluster and leaves rawN out.
                if url.is_cluster() && !scale {
                    return Err(usage!(
                        "{url}: bench measures a Redis Cluster in --mode threads only (its other \
                         modes address one server per node)"
                    )
                    .into());
                }
                let plain_tcp = !url.is_tls() && url.unix_path().is_none();
                if !plain_tcp && (mutex || !rw_kinds.is_empty() || scale) {
                    return Err(usage!(
                        "{url}: the baselines speak plaintext TCP; give redis:// nodes for \
                         --mode {mode} (bench --tls measures TLS against plaintext)"
                    )
                    .into());
                }
            }
            let origin = match from {
                NodesFrom::Option => format!("{} nodes from --nodes", urls.len()),
                NodesFrom::Environment => format!("{} nodes from REDLOCK_NODES", urls.len()),
            };
            (urls, origin)
        }
        None => {
            let n = instances.unwrap_or(5);
            if n > redlock_mux::MAX_NODES {
                return Err(usage!("--instances: at most {}", redlock_mux::MAX_NODES).into());
            }
            let program = server
                .as_ref()
                .map_or_else(|| "redis-server".to_owned(), |p| p.display().to_string());
            if !json {
                eprintln!("starting {n} local servers ({program})...");
            }
            let programs = vec![server.as_deref(); n];
            cluster = RedisCluster::start_programs(&programs)
                .map_err(|e| Fail::other(format!("could not start {program}: {e}")))?;
            let urls = cluster.urls();
            let origin = format!("{n} local {} instances", server_name(&urls[0]));
            if !json {
                eprintln!("started {origin}");
            }
            (urls, origin)
        }
    };

    let sizes = sizes(urls.len());
    let progress = Progress::new(io::stderr().is_terminal());
    let mut report = Report {
        origin,
        iters,
        ..Report::default()
    };
    for &n in &sizes {
        let nodes = &urls[..n];
        if mutex {
            report.mutex.push(bench_mutex(nodes, iters, &progress)?);
        }
        // Read-write locks at the largest N only (5 by default), where the targets are; the
        // semaphore at every N.
        let kinds: Vec<Kind> = rw_kinds
            .iter()
            .copied()
            .filter(|k| k.side().is_none() || n == urls.len())
            .collect();
        if !kinds.is_empty() {
            report.rw.push(bench_rw(nodes, iters, &kinds, &progress)?);
        }
        if downgrade {
            report
                .downgrade
                .push(bench_downgrade(nodes, iters, &progress)?);
        }
    }
    if handoff {
        for fair in [false, true] {
            for threads in HANDOFF_THREADS {
                report
                    .handoff
                    .push(bench_handoff(&urls, threads, fair, &progress)?);
            }
        }
    }
    if scale {
        let plan = ScalePlan {
            cell,
            rounds,
            counts: thread_counts,
        };
        report.threads = bench_threads(&urls, &plan, &progress)?;
        report.scale = Some(plan);
    }
    progress.clear();

    let mut out = io::stdout().lock();
    if json {
        writeln!(out, "{}", report.json())?;
    } else {
        report.print(&mut out)?;
    }
    out.flush()?;
    Ok(0)
}

/// What the server at `url` is, as `INFO server` says: `valkey-server 8.1.8`.
fn server_name(url: &str) -> String {
    let info = NodeUrl::parse(url).ok().and_then(|url| {
        let mut conn =
            crate::node::NodeConn::connect(&url, &args::TlsFiles::default(), TTL).ok()?;
        conn.server().ok()?
    });
    info.map_or_else(|| "redis-server".to_owned(), |s| s.to_string())
}

/// A comma-separated list of thread counts, each from 1 to 1024.
fn counts(value: std::ffi::OsString) -> Result<Vec<usize>, Fail> {
    let text = args::text("--threads", value)?;
    let counts = text
        .split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(usage!(
                "--threads: {t:?} is not a thread count (1 to 1024); write it like 1,4,16"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(counts)
}

/// Everything one run measured.
#[derive(Default)]
struct Report {
    origin: String,
    iters: usize,
    mutex: Vec<MutexResult>,
    rw: Vec<RwResult>,
    downgrade: Vec<DowngradeResult>,
    handoff: Vec<HandoffResult>,
    threads: Vec<ThreadsResult>,
    /// How the threads mode ran, if it did.
    scale: Option<ScalePlan>,
}

/// The N measured: 1, 3 and 5 where there are that many nodes, and all the nodes.
fn sizes(nodes: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [1, 3, 5].into_iter().filter(|&n| n <= nodes).collect();
    if !sizes.contains(&nodes) {
        sizes.push(nodes);
    }
    sizes
}

/// Latencies of one client: acquire, release, and the two back to back.
#[derive(Default)]
struct Phases {
    acquire: Samples,
    release: Samples,
    cycle: Samples,
    errors: u64,
}

impl Phases {
    fn with_capacity(n: usize) -> Phases {
        Phases {
            acquire: Samples::with_capacity(n),
            release: Samples::with_capacity(n),
            cycle: Samples::with_capacity(n),
            errors: 0,
        }
    }

    fn record(&mut self, start: Instant, acquired: Instant, released: Instant) {
        self.acquire.push(acquired - start);
        self.release.push(released - acquired);
        self.cycle.push(released - start);
    }
}

/// Mutex figures at one N.
struct MutexResult {
    n: usize,
    ours: Phases,
    baseline: Phases,
    /// The library's own statistics of the client measured.
    stats: redlock_mux::Stats,
}

fn bench_mutex(urls: &[String], iters: usize, progress: &Progress) -> Result<MutexResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let mut base = baseline(urls)?;
    let mut tokens = Tokens::new();
    let ours_key = format!("redlock-mux:bench:ours:{n}");
    let base_key = format!("redlock-mux:bench:baseline:{n}");

    let mut ours = Phases::with_capacity(iters);
    let mut baseline = Phases::with_capacity(iters);
    let mut scratch = Phases::default();
    // Warm-up: connections open, scripts load, caches and branch predictors settle.
    let warmup = (iters / 10).clamp(100, 2000);
    ours_cycles(&client, Kind::Mutex, &ours_key, warmup, &mut scratch);
    base_cycles(&mut base, &mut tokens, &base_key, warmup, &mut scratch)?;

    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Alternate which client goes first, so neither always follows the other.
        if block % 2 == 0 {
            ours_cycles(&client, Kind::Mutex, &ours_key, count, &mut ours);
            base_cycles(&mut base, &mut tokens, &base_key, count, &mut baseline)?;
        } else {
            base_cycles(&mut base, &mut tokens, &base_key, count, &mut baseline)?;
            ours_cycles(&client, Kind::Mutex, &ours_key, count, &mut ours);
        }
        done += count;
        block += 1;
        progress.show(&format!("mutex N={n}"), done, iters);
    }
    let stats = client.stats();
    Ok(MutexResult {
        n,
        ours,
        baseline,
        stats,
    })
}

/// A client's statistics ([`redlock_mux::Client::stats`]) as JSON.
fn stats_json(s: &redlock_mux::Stats) -> serde_json::Value {
    let rounds = |r: &redlock_mux::RoundStats| json!({"won": r.won, "contended": r.contended, "unreachable": r.unreachable});
    let k = &s.kinds;
    json!({
        "rounds": {
            "mutex": rounds(&k.mutex),
            "read": rounds(&k.read),
            "write": rounds(&k.write),
            "all": rounds(&k.all),
            "fenced_mutex": rounds(&k.fenced_mutex),
            "fenced_write": rounds(&k.fenced_write),
            "semaphore": rounds(&k.semaphore),
        },
        "nodes": s.nodes.iter().map(node_stats_json).collect::<Vec<_>>(),
        "wakeups": s.wakeups,
        "retries": s.retries,
        "cancellations": s.cancellations,
    })
}

/// One node's statistics ([`redlock_mux::NodeStats`]) as JSON: reply latency and failures.
pub(crate) fn node_stats_json(n: &redlock_mux::NodeStats) -> serde_json::Value {
    let us = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
    let f = &n.failures;
    json!({
        "latency_p50_us": us(n.latency_p50),
        "latency_p99_us": us(n.latency_p99),
        "latency_samples": n.latency_samples,
        "failures": {
            "timeout": f.timeout, "connect": f.connect, "backoff": f.backoff,
            "io": f.io, "protocol": f.protocol, "server": f.server,
            "unexpected_reply": f.unexpected_reply, "setup": f.setup,
        },
    })
}

/// Figures of other lock kinds at one N, next to the mutex measured in the same run, and read
/// and write locks next to `rawQ-rw` too.
struct RwResult {
    n: usize,
    /// The mutex first, then each kind measured.
    kinds: Vec<(Kind, Phases)>,
    /// `rawQ-rw` for each kind measured, in the order of `kinds[1..]`: for read and write
    /// locks; `None` for the semaphore.
    raw: Vec<Option<Phases>>,
}

/// Who runs one block of an other-kinds benchmark.
#[derive(Debug, Clone, Copy)]
enum RwClient {
    /// The library: `kinds[i]`.
    Ours(usize),
    /// `rawQ-rw`, as the kind `kinds[i + 1]` (a read or a write lock).
    Raw(usize),
}

fn bench_rw(
    urls: &[String],
    iters: usize,
    kinds: &[Kind],
    progress: &Progress,
) -> Result<RwResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    // rawQ-rw only where a read or write lock is measured.
    let mut raw = if kinds.iter().any(|k| k.side().is_some()) {
        Some(
            RawQRw::connect_targets(&targets(urls)?)
                .map_err(|e| Fail::other(format!("rawQ-rw could not connect: {e}")))?,
        )
    } else {
        None
    };
    let mut tokens = Tokens::new();
    let mut measured: Vec<(Kind, Phases)> = std::iter::once(Kind::Mutex)
        .chain(kinds.iter().copied())
        .map(|k| (k, Phases::with_capacity(iters)))
        .collect();
    let mut raw_measured: Vec<Option<Phases>> = kinds
        .iter()
        .map(|k| k.side().map(|_| Phases::with_capacity(iters)))
        .collect();
    // One key per kind: a read and a write lock on one key share keys on the nodes.
    let key = |k: Kind| format!("redlock-mux:bench:rw:{}:{n}", k.name());
    let raw_keys = |k: Kind| {
        (
            format!("redlock-mux:bench:rawq-rw:{}:{n}:r", k.name()),
            format!("redlock-mux:bench:rawq-rw:{}:{n}:w", k.name()),
        )
    };
    let clients: Vec<RwClient> = (0..measured.len())
        .map(RwClient::Ours)
        .chain(
            (0..kinds.len())
                .filter(|&i| kinds[i].side().is_some())
                .map(RwClient::Raw),
        )
        .collect();
    let mut run = |who: RwClient,
                   count: usize,
                   scratch: bool,
                   measured: &mut [(Kind, Phases)],
                   raw_measured: &mut [Option<Phases>]|
     -> Result<(), Fail> {
        let mut sink = Phases::default();
        match who {
            RwClient::Ours(i) => {
                let (kind, into) = &mut measured[i];
                let into = if scratch { &mut sink } else { into };
                ours_cycles(&client, *kind, &key(*kind), count, into);
            }
            RwClient::Raw(i) => {
                let kind = kinds[i];
                let (Some(side), Some(raw), Some(into)) =
                    (kind.side(), raw.as_mut(), raw_measured[i].as_mut())
                else {
                    return Ok(());
                };
                let into = if scratch { &mut sink } else { into };
                let (r, w) = raw_keys(kind);
                raw_rw_cycles(raw, &mut tokens, side, (&r, &w), count, into)?;
            }
        }
        Ok(())
    };
    let warmup = (iters / 10).clamp(100, 2000);
    for &who in &clients {
        run(who, warmup, true, &mut measured, &mut raw_measured)?;
    }
    let label = format!(
        "{} N={n}",
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join("+")
    );
    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Rotate which client goes first, so none always follows another.
        let len = clients.len();
        for i in 0..len {
            run(
                clients[(block + i) % len],
                count,
                false,
                &mut measured,
                &mut raw_measured,
            )?;
        }
        done += count;
        block += 1;
        progress.show(&label, done, iters);
    }
    Ok(RwResult {
        n,
        kinds: measured,
        raw: raw_measured,
    })
}

/// `count` cycles of `rawQ-rw` as a reader or a writer (`side`) on the keys `(r, w)`: acquire,
/// then release.
fn raw_rw_cycles(
    raw: &mut RawQRw,
    tokens: &mut Tokens,
    side: Side,
    (r, w): (&str, &str),
    count: usize,
    into: &mut Phases,
) -> Result<(), Fail> {
    let ttl_ms = TTL.as_millis() as u64;
    let (r, w) = (r.as_bytes(), w.as_bytes());
    for _ in 0..count {
        let start = Instant::now();
        let token = tokens.next_token();
        let won = raw
            .try_acquire(side, r, w, &token, ttl_ms)
            .map_err(|e| Fail::other(format!("rawQ-rw acquire: {e}")))?;
        let acquired = Instant::now();
        if won {
            raw.release(side, r, w, &token)
                .map_err(|e| Fail::other(format!("rawQ-rw release: {e}")))?;
            into.record(start, acquired, Instant::now());
        } else {
            into.errors += 1;
        }
    }
    Ok(())
}

/// Downgrade figures at one N, next to a mutex extend measured in the same run.
struct DowngradeResult {
    n: usize,
    /// `WriteLock::downgrade` of a held write lock.
    downgrade: Samples,
    /// `Lock::extend` of a held mutex, to the same TTL.
    extend: Samples,
    errors: u64,
}

/// Alternating blocks of: take a mutex, time its extend, release it; take a write lock, time
/// its downgrade, release the read lock. Both timed operations are one round on a held lock.
fn bench_downgrade(
    urls: &[String],
    iters: usize,
    progress: &Progress,
) -> Result<DowngradeResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let mutex_key = format!("redlock-mux:bench:extend:{n}");
    let rw_key = format!("redlock-mux:bench:downgrade:{n}");
    let mut r = DowngradeResult {
        n,
        downgrade: Samples::with_capacity(iters),
        extend: Samples::with_capacity(iters),
        errors: 0,
    };
    let extends = |count: usize, into: &mut Samples, errors: &mut u64| {
        for _ in 0..count {
            let Ok(mut lock) = client.try_lock(&mutex_key, TTL) else {
                *errors += 1;
                continue;
            };
            let start = Instant::now();
            let ok = lock.extend(TTL).is_ok();
            let took = start.elapsed();
            if ok && lock.release().is_ok() {
                into.push(took);
            } else {
                *errors += 1;
            }
        }
    };
    let downgrades = |count: usize, into: &mut Samples, errors: &mut u64| {
        for _ in 0..count {
            let Ok(writer) = client.try_write_lock(&rw_key, TTL) else {
                *errors += 1;
                continue;
            };
            let start = Instant::now();
            let reader = writer.downgrade();
            let took = start.elapsed();
            match reader.map(|r| r.release()) {
                Ok(Ok(())) => into.push(took),
                _ => *errors += 1,
            }
        }
    };
    let warmup = (iters / 10).clamp(100, 2000);
    let (mut scratch, mut ignored) = (Samples::default(), 0);
    extends(warmup, &mut scratch, &mut ignored);
    downgrades(warmup, &mut scratch, &mut ignored);
    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        if block % 2 == 0 {
            extends(count, &mut r.extend, &mut r.errors);
            downgrades(count, &mut r.downgrade, &mut r.errors);
        } else {
            downgrades(count, &mut r.downgrade, &mut r.errors);
            extends(count, &mut r.extend, &mut r.errors);
        }
        done += count;
        block += 1;
        progress.show(&format!("downgrade N={n}"), done, iters);
    }
    Ok(r)
}

fn print_downgrade(
    out: &mut dyn Write,
    origin: &str,
    iters: usize,
    results: &mut [DowngradeResult],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "write-to-read downgrade next to a mutex extend: {origin}; {iters} of each per N, in alternating blocks of {BLOCK}"
    )?;
    writeln!(
        out,
        "downgrade = WriteLock::downgrade of a held write lock; extend = Lock::extend of a held mutex; ratio = downgrade / extend"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>2}  {:>13} {:>10} {:>7}   {:>13} {:>10} {:>7} {:>6}",
        "N",
        "downgrade p50",
        "extend p50",
        "ratio",
        "downgrade p99",
        "extend p99",
        "ratio",
        "errors"
    )?;
    for r in results.iter_mut() {
        let (d, e) = (r.downgrade.summary(), r.extend.summary());
        writeln!(
            out,
            "{:>2}  {:>13} {:>10} {:>6.3}x   {:>13} {:>10} {:>6.3}x {:>6}",
            r.n,
            fmt_duration(d.p50),
            fmt_duration(e.p50),
            ratio(d.p50, e.p50),
            fmt_duration(d.p99),
            fmt_duration(e.p99),
            ratio(d.p99, e.p99),
            r.errors,
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "goal: downgrade p50 within {DOWNGRADE_TARGET}x of a mutex extend's at N=5"
    )?;
    for r in results.iter_mut() {
        let q = ratio(r.downgrade.quantile(0.5), r.extend.quantile(0.5));
        writeln!(
            out,
            "  N={}: downgrade p50 {:.3}x [{}]",
            r.n,
            q,
            met(q <= DOWNGRADE_TARGET)
        )?;
    }
    Ok(())
}

/// `count` try-acquire and release cycles of `kind` on `key`, recorded into `into`.
fn ours_cycles(client: &Client, kind: Kind, key: &str, count: usize, into: &mut Phases) {
    match kind {
        Kind::Mutex => timed(count, into, || client.try_lock(key, TTL), |l| l.release()),
        Kind::Read => timed(
            count,
            into,
            || client.try_read_lock(key, TTL),
            |l| l.release(),
        ),
        Kind::Write => timed(
            count,
            into,
            || client.try_write_lock(key, TTL),
            |l| l.release(),
        ),
        Kind::Semaphore => match client.semaphore(key, SEM_PERMITS) {
            Ok(sem) => timed(count, into, || sem.try_acquire(TTL), |p| p.release()),
            Err(_) => into.errors += count as u64,
        },
    }
}

fn timed<G>(
    count: usize,
    into: &mut Phases,
    acquire: impl Fn() -> Result<G, Error>,
    release: impl Fn(G) -> Result<(), Error>,
) {
    for _ in 0..count {
        let start = Instant::now();
        match acquire() {
            Ok(guard) => {
                let acquired = Instant::now();
                let ok = release(guard).is_ok();
                let released = Instant::now();
                if ok {
                    into.record(start, acquired, released);
                } else {
                    into.errors += 1;
                }
            }
            Err(_) => into.errors += 1,
        }
    }
}

fn base_cycles(
    base: &mut Raw,
    tokens: &mut Tokens,
    key: &str,
    count: usize,
    into: &mut Phases,
) -> Result<(), Fail> {
    let ttl_ms = TTL.as_millis() as u64;
    for _ in 0..count {
        let start = Instant::now();
        let token = tokens.next_token();
        let won = base
            .try_acquire(key.as_bytes(), &token, ttl_ms)
            .map_err(|e| Fail::other(format!("baseline acquire: {e}")))?;
        let acquired = Instant::now();
        if won {
            base.release(key.as_bytes(), &token)
                .map_err(|e| Fail::other(format!("baseline release: {e}")))?;
            into.record(start, acquired, Instant::now());
        } else {
            into.errors += 1;
        }
    }
    Ok(())
}

/// The raw baseline on `urls`.
fn baseline(urls: &[String]) -> Result<Raw, Fail> {
    Raw::connect_targets(&targets(urls)?)
        .map_err(|e| Fail::other(format!("the baseline could not connect: {e}")))
}

/// The nodes of `urls` for the hand-written clients, read by the library's URL parser: `AUTH`
/// and `SELECT` as they ask, then nothing but lock commands.
fn targets(urls: &[String]) -> Result<Vec<Target>, Fail> {
    urls.iter()
        .map(|url| {
            let url = NodeUrl::parse(url).map_err(|e| usage!("{e}"))?;
            let mut setup = Vec::new();
            if let Some(password) = url.password() {
                let mut auth = vec![b"AUTH".to_vec()];
                auth.extend(url.user().map(<[u8]>::to_vec));
                auth.push(password.to_vec());
                setup.push(auth);
            }
            if url.db() != 0 {
                setup.push(vec![b"SELECT".to_vec(), url.db().to_string().into_bytes()]);
            }
            Ok::<Target, Fail>(Target {
                addrs: url.addrs().to_vec(),
                setup,
            })
        })
        .collect()
}

/// Contended hand-off figures for one configuration.
struct HandoffResult {
    n: usize,
    threads: usize,
    fair: bool,
    /// From one thread starting its release to another thread's lock returning.
    gaps: Samples,
    /// Grants that went to the thread that had just released (not counted in `gaps`).
    regrants: usize,
    /// Grants that began before the previous one's release did: mutual exclusion broken.
    overlaps: usize,
    errors: u64,
}

/// `threads` threads, each with its own clone of one client (sharing its connections), loop
/// lock → hold [`HANDOFF_HOLD`] → release for [`HANDOFF_RUN`]. Every grant's acquire and
/// release instants are taken from the one monotonic clock; sorted by acquire, each grant to
/// another thread than the previous holder gives one gap: its acquire minus the previous
/// holder's release start.
fn bench_handoff(
    urls: &[String],
    threads: usize,
    fair: bool,
    progress: &Progress,
) -> Result<HandoffResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .fair(fair)
        // The figure is the hand-off, not the retry budget: wait as long as it takes, up to
        // the wait timeout.
        .retry_count(u32::MAX)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let key = format!("redlock-mux:bench:handoff:{n}:{threads}:{fair}");
    let label = format!("handoff{} x{threads}", if fair { " fair" } else { "" });
    progress.show(&label, 0, 1);
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            let key = key.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                // Open this thread's connections before the run.
                let _ = client
                    .try_lock(format!("{key}:warmup:{t}"), TTL)
                    .map(|l| l.release());
                barrier.wait();
                let deadline = Instant::now() + HANDOFF_RUN;
                let mut grants: Vec<(Instant, Instant, usize)> = Vec::new();
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    match client.lock(&key, TTL) {
                        Ok(lock) => {
                            let acquired = Instant::now();
                            thread::sleep(HANDOFF_HOLD);
                            let releasing = Instant::now();
                            if lock.release().is_err() {
                                errors += 1;
                            }
                            grants.push((acquired, releasing, t));
                        }
                        Err(_) => {
                            errors += 1;
                            thread::sleep(HANDOFF_HOLD);
                        }
                    }
                }
                (grants, errors)
            })
        })
        .collect();
    let mut grants = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (g, e) = w
            .join()
            .map_err(|_| Fail::other("a hand-off thread panicked".into()))?;
        grants.extend(g);
        errors += e;
    }
    progress.show(&label, 1, 1);
    grants.sort_by_key(|g| g.0);
    let counted_from = grants.first().map(|g| g.0 + HANDOFF_WARMUP);
    let mut result = HandoffResult {
        n,
        threads,
        fair,
        gaps: Samples::with_capacity(grants.len()),
        regrants: 0,
        overlaps: 0,
        errors,
    };
    for pair in grants.windows(2) {
        let ((_, prev_release, prev_thread), (next_acquire, _, next_thread)) = (pair[0], pair[1]);
        if counted_from.is_some_and(|from| prev_release < from) {
            continue;
        }
        if next_acquire < prev_release {
            result.overlaps += 1;
        } else if next_thread == prev_thread {
            result.regrants += 1;
        } else {
            result.gaps.push(next_acquire - prev_release);
        }
    }
    Ok(result)
}

/// How the threads mode runs.
struct ScalePlan {
    /// Length of one cell: one client at one T.
    cell: Duration,
    /// Cells per client and T; ops/s and CPU per cycle are the median of the rounds.
    rounds: usize,
    /// The thread counts.
    counts: Vec<usize>,
}

/// The clients of the threads mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scaler {
    /// One `Client` shared by every thread.
    Ours,
    /// The raw baseline, one connection set per thread, returning at the quorum.
    RawN,
}

impl Scaler {
    fn name(self) -> &'static str {
        match self {
            Scaler::Ours => "ours",
            Scaler::RawN => "rawN",
        }
    }
}

/// One client's figures at one T, over every round.
#[derive(Default)]
struct ScaleFigures {
    acquire: Samples,
    cycle: Samples,
    /// Operations per second of each round.
    rates: Vec<f64>,
    /// Server CPU (user + sys, all nodes) per cycle of each round, in microseconds.
    cpu_per_cycle: Vec<f64>,
    /// Each probed server's CPU per cycle in each round (rounds × servers), in microseconds.
    cpu_by_server: Vec<Vec<f64>>,
    /// The most connections any node had from this client during each round.
    conns: Vec<u64>,
    /// The most of those that were subscribers (pub/sub), during each round.
    subs: Vec<u64>,
    /// Failed lock or release calls, by message.
    failures: BTreeMap<String, u64>,
}

impl ScaleFigures {
    fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    fn ops_per_sec(&self) -> f64 {
        median(&self.rates)
    }

    fn cpu_us_per_cycle(&self) -> f64 {
        median(&self.cpu_per_cycle)
    }

    /// The median over the rounds of each probed server's CPU per cycle, in microseconds.
    fn cpu_us_per_cycle_by_server(&self) -> Vec<f64> {
        let servers = self.cpu_by_server.first().map_or(0, Vec::len);
        (0..servers)
            .map(|i| median(&self.cpu_by_server.iter().map(|r| r[i]).collect::<Vec<_>>()))
            .collect()
    }

    fn connections(&self) -> u64 {
        self.conns.iter().copied().max().unwrap_or(0)
    }

    fn subscribers(&self) -> u64 {
        self.subs.iter().copied().max().unwrap_or(0)
    }

    fn fail(&mut self, why: String) {
        count_failure(&mut self.failures, why, 1);
    }

    fn json(&mut self) -> serde_json::Value {
        json!({
            "ops_per_sec": self.ops_per_sec(),
            "ops_per_sec_rounds": self.rates,
            "cycles": self.cycle.len(),
            "acquire": summary_json(self.acquire.summary()),
            "cycle": summary_json(self.cycle.summary()),
            "cycle_histogram": histogram_json(&self.cycle),
            "failures": self.failed(),
            "failure_reasons": self.failures,
            "connections_per_node": self.connections(),
            "connections_per_node_rounds": self.conns,
            "subscriber_connections_per_node": self.subscribers(),
            "server_cpu_us_per_cycle": self.cpu_us_per_cycle(),
            "server_cpu_us_per_cycle_rounds": self.cpu_per_cycle,
            "server_cpu_us_per_cycle_by_server": self.cpu_us_per_cycle_by_server(),
        })
    }
}

/// Adds `count` failures with message `why` (read by [`failure_kind`], so that alike failures
/// count together), keeping at most [`REASONS`] messages.
fn count_failure(into: &mut BTreeMap<String, u64>, why: String, count: u64) {
    let why = failure_kind(&why);
    let why = if into.len() >= REASONS && !into.contains_key(&why) {
        "other".to_owned()
    } else {
        why
    };
    *into.entry(why).or_insert(0) += count;
}

/// The median of `values` (the upper one of an even count); 0 when empty.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Scale figures for one thread count: ours next to rawN.
struct ThreadsResult {
    n: usize,
    threads: usize,
    ours: ScaleFigures,
    raw: ScaleFigures,
    /// The masters probed on each node (1 for a standalone server).
    masters: Vec<usize>,
    /// rawN left out: a node is a Redis Cluster (the baseline addresses one server per node).
    raw_skipped: bool,
}

/// What one thread of a cell measured.
struct ThreadRun {
    acquire: Samples,
    cycle: Samples,
    failures: BTreeMap<String, u64>,
    ended: Instant,
}

/// The threads mode: at every T of the plan, cells of ours and of rawN in alternating order,
/// `plan.rounds` times, on all the nodes. One probe connection per node reads what the
/// servers report.
fn bench_threads(
    urls: &[String],
    plan: &ScalePlan,
    progress: &Progress,
) -> Result<Vec<ThreadsResult>, Fail> {
    let targets = targets(urls)?;
    let clustered: Vec<bool> = urls
        .iter()
        .map(|u| NodeUrl::parse(u).is_ok_and(|u| u.is_cluster()))
        .collect();
    let raw_skipped = clustered.iter().any(|&c| c);
    // One probe per server: a standalone node's, or each master of a cluster node.
    let mut probes = Vec::new();
    let mut masters = Vec::new();
    for (target, &clustered) in targets.iter().zip(&clustered) {
        let mut probe = Probe::connect(target)
            .map_err(|e| Fail::other(format!("the probe could not connect: {e}")))?;
        if !clustered {
            probes.push(probe);
            masters.push(1);
            continue;
        }
        let addrs = probe
            .cluster_masters()
            .map_err(|e| Fail::other(format!("the cluster's masters: {e}")))?;
        masters.push(addrs.len());
        for addr in addrs {
            let master = Target {
                addrs: vec![addr],
                setup: target.setup.clone(),
            };
            probes.push(
                Probe::connect(&master)
                    .map_err(|e| Fail::other(format!("the probe could not connect: {e}")))?,
            );
        }
    }
    // Connections the nodes have before anything is measured (other than the probe's).
    let idle = clients(&mut probes)?;
    let mut results = Vec::new();
    let cells = plan.counts.len() * plan.rounds * 2;
    let mut done = 0;
    for (i, &threads) in plan.counts.iter().enumerate() {
        let mut result = ThreadsResult {
            n: urls.len(),
            threads,
            ours: ScaleFigures::default(),
            raw: ScaleFigures::default(),
            masters: masters.clone(),
            raw_skipped,
        };
        for round in 0..plan.rounds {
            let order = if (round + i) % 2 == 0 {
                [Scaler::Ours, Scaler::RawN]
            } else {
                [Scaler::RawN, Scaler::Ours]
            };
            for who in order {
                if raw_skipped && who == Scaler::RawN {
                    continue;
                }
                progress.show(&format!("{} x{threads}", who.name()), done, cells);
                let into = match who {
                    Scaler::Ours => &mut result.ours,
                    Scaler::RawN => &mut result.raw,
                };
                let cell = Cell {
                    who,
                    urls,
                    targets: &targets,
                    threads,
                    length: plan.cell,
                    round,
                    spread: raw_skipped,
                };
                cell.run(&mut probes, &idle, into)?;
                done += 1;
            }
        }
        results.push(result);
    }
    progress.show("threads", done, cells);
    Ok(results)
}

/// Each node's client connections, without the probe's own.
fn clients(probes: &mut [Probe]) -> Result<Vec<Connections>, Fail> {
    probes
        .iter_mut()
        .map(|p| p.connections())
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| Fail::other(format!("CLIENT LIST: {e}")))
}

/// Each probed server's CPU time so far.
fn server_cpus(probes: &mut [Probe]) -> Result<Vec<Duration>, Fail> {
    probes
        .iter_mut()
        .map(|p| p.cpu())
        .collect::<io::Result<Vec<Duration>>>()
        .map_err(|e| Fail::other(format!("INFO cpu: {e}")))
}

/// One cell of the threads mode: one client, T threads, a fixed length.
struct Cell<'a> {
    who: Scaler,
    urls: &'a [String],
    targets: &'a [Target],
    threads: usize,
    length: Duration,
    round: usize,
    /// Each thread cycles over [`SPREAD_KEYS`] keys instead of one, so that a cluster's
    /// slots, and so its masters, share the load.
    spread: bool,
}

/// The keys each thread of a cell cycles over when a node is a Redis Cluster.
const SPREAD_KEYS: usize = 64;

impl Cell<'_> {
    /// Runs the cell and adds its figures to `into`. The previous cell's connections are
    /// waited out first (up to a few seconds), so that the count is this client's alone.
    fn run(
        &self,
        probes: &mut [Probe],
        idle: &[Connections],
        into: &mut ScaleFigures,
    ) -> Result<(), Fail> {
        let settle = Instant::now() + Duration::from_secs(3);
        let mut before = clients(probes)?;
        while before.iter().zip(idle).any(|(b, i)| b.all > i.all) && Instant::now() < settle {
            thread::sleep(Duration::from_millis(20));
            before = clients(probes)?;
        }
        let n = self.urls.len();
        let threads = self.threads;
        // Built only for its own cells: a client may connect as it is built.
        let client = match self.who {
            Scaler::Ours => Some(
                Client::builder()
                    .nodes(self.urls)
                    .build()
                    .map_err(|e| Fail::other(format!("bad nodes: {e}")))?,
            ),
            Scaler::RawN => None,
        };
        let ready = Arc::new(Barrier::new(threads + 1));
        let go = Arc::new(Barrier::new(threads + 1));
        let per_thread = (CELL_CAP / threads).max(1);
        let length = self.length;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (ready, go) = (ready.clone(), go.clone());
                let key = format!(
                    "redlock-mux:bench:threads:{}:{n}:{threads}:{}:{t}",
                    self.who.name(),
                    self.round
                );
                let keys: Vec<String> = if self.spread {
                    (0..SPREAD_KEYS).map(|k| format!("{key}:{k}")).collect()
                } else {
                    vec![key]
                };
                let mut locker = match &client {
                    Some(client) => Locker::Ours(client.clone()),
                    None => Locker::Raw(None, self.targets.to_vec(), Tokens::new()),
                };
                thread::spawn(move || {
                    // Connections open here, before the cell, whatever they cost.
                    locker.connect();
                    for w in 0..CELL_WARMUP {
                        let _ = locker.cycle(&keys[w % keys.len()]);
                    }
                    ready.wait();
                    go.wait();
                    let deadline = Instant::now() + length;
                    let mut run = ThreadRun {
                        acquire: Samples::with_capacity(per_thread.min(1 << 16)),
                        cycle: Samples::with_capacity(per_thread.min(1 << 16)),
                        failures: BTreeMap::new(),
                        ended: Instant::now(),
                    };
                    let mut next = 0;
                    while run.cycle.len() < per_thread && Instant::now() < deadline {
                        let start = Instant::now();
                        let key = &keys[next % keys.len()];
                        next += 1;
                        match locker.cycle(key) {
                            Ok(acquired) => {
                                let released = Instant::now();
                                run.acquire.push(acquired - start);
                                run.cycle.push(released - start);
                            }
                            Err(why) => {
                                count_failure(&mut run.failures, why, 1);
                                if locker.broken() {
                                    break;
                                }
                            }
                        }
                    }
                    run.ended = Instant::now();
                    run
                })
            })
            .collect();
        ready.wait();
        let cpu_before = server_cpus(probes)?;
        go.wait();
        let start = Instant::now();
        // Connections per node, sampled at a quarter, half and three quarters of the cell.
        let (mut conns, mut subs) = (0, 0);
        for quarter in 1..=3u32 {
            let at = start + length * quarter / 4;
            thread::sleep(at.saturating_duration_since(Instant::now()));
            for (c, b) in clients(probes)?.iter().zip(&before) {
                conns = conns.max(c.all.saturating_sub(b.all));
                subs = subs.max(c.subscribers.saturating_sub(b.subscribers));
            }
        }
        let mut end = start;
        let mut cycles = 0;
        for w in workers {
            let run = w
                .join()
                .map_err(|_| Fail::other("a benchmark thread panicked".into()))?;
            cycles += run.cycle.len();
            into.acquire.extend(&run.acquire);
            into.cycle.extend(&run.cycle);
            for (why, count) in run.failures {
                count_failure(&mut into.failures, why, count);
            }
            end = end.max(run.ended);
        }
        let by_server: Vec<Duration> = server_cpus(probes)?
            .iter()
            .zip(&cpu_before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let cpu: Duration = by_server.iter().sum();
        into.cpu_by_server.push(
            by_server
                .iter()
                .map(|c| {
                    if cycles > 0 {
                        us(*c) / cycles as f64
                    } else {
                        0.0
                    }
                })
                .collect(),
        );
        let wall = (end - start).as_secs_f64();
        into.rates.push(if wall > 0.0 {
            cycles as f64 / wall
        } else {
            0.0
        });
        into.cpu_per_cycle.push(if cycles > 0 {
            us(cpu) / cycles as f64
        } else {
            0.0
        });
        into.conns.push(conns);
        into.subs.push(subs);
        if cycles == 0 && into.failures.is_empty() {
            into.fail("no cycle completed".into());
        }
        Ok(())
    }
}

/// One thread's client in a threads-mode cell.
enum Locker {
    /// A clone of the one shared client.
    Ours(Client),
    /// The raw baseline: connected in the thread (None until then, or after an I/O error),
    /// with its nodes and token source.
    Raw(Option<Raw>, Vec<Target>, Tokens),
}

impl Locker {
    fn connect(&mut self) {
        if let Locker::Raw(raw @ None, targets, _) = self {
            *raw = Raw::connect_targets(targets).ok().map(Raw::at_quorum);
        }
    }

    /// Whether this client can go on after a failure: the raw baseline cannot after an I/O
    /// error (its connections may hold stray replies).
    fn broken(&self) -> bool {
        matches!(self, Locker::Raw(None, _, _))
    }

    /// One try-lock and release on `key`: when the lock was acquired, or why it failed.
    fn cycle(&mut self, key: &str) -> Result<Instant, String> {
        match self {
            Locker::Ours(client) => {
                let lock = client.try_lock(key, TTL).map_err(|e| e.to_string())?;
                let acquired = Instant::now();
                lock.release().map_err(|e| format!("release: {e}"))?;
                Ok(acquired)
            }
            Locker::Raw(slot, _, tokens) => {
                raw_cycle(slot, tokens, key.as_bytes(), TTL.as_millis() as u64)
            }
        }
    }
}

/// A one-line progress bar on stderr, only when stderr is a terminal (never in a log file or
/// a pipe).
struct Progress {
    enabled: bool,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress { enabled }
    }

    fn show(&self, label: &str, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        const WIDTH: usize = 30;
        let filled = done * WIDTH / total.max(1);
        // A terminal that went away is no reason to stop measuring.
        let _ = write!(
            io::stderr(),
            "\r{label:<14} [{}{}] {done}/{total}   ",
            "#".repeat(filled),
            ".".repeat(WIDTH - filled)
        );
    }

    fn clear(&self) {
        if self.enabled {
            let _ = write!(io::stderr(), "\r{:70}\r", "");
        }
    }
}

impl Report {
    fn print(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let (origin, iters) = (&self.origin, self.iters);
        if !self.mutex.is_empty() {
            print_mutex(out, origin, iters, &mut self.mutex)?;
        }
        if !self.rw.is_empty() {
            print_rw(out, origin, iters, &mut self.rw)?;
        }
        if !self.downgrade.is_empty() {
            print_downgrade(out, origin, iters, &mut self.downgrade)?;
        }
        if !self.handoff.is_empty() {
            print_handoff(out, origin, &mut self.handoff)?;
        }
        if let Some(plan) = &self.scale {
            print_threads(out, origin, plan, &mut self.threads)?;
        }
        Ok(())
    }

    /// Every figure, as one JSON object.
    fn json(&mut self) -> serde_json::Value {
        let mutex: Vec<serde_json::Value> = self
            .mutex
            .iter_mut()
            .map(|r| {
                json!({
                    "n": r.n,
                    "ratio_p50": phase_ratios(0.5, &mut r.ours, &mut r.baseline),
                    "ratio_p99": phase_ratios(0.99, &mut r.ours, &mut r.baseline),
                    "ours": phases_json(&mut r.ours),
                    "baseline": phases_json(&mut r.baseline),
                    "stats": stats_json(&r.stats),
                })
            })
            .collect();
        let rw: Vec<serde_json::Value> = self
            .rw
            .iter_mut()
            .map(|r| {
                let (first, rest) = r.kinds.split_at_mut(1);
                let base = &mut first[0].1;
                let mut fields = serde_json::Map::new();
                fields.insert("n".into(), json!(r.n));
                for ((kind, phases), raw) in rest.iter_mut().zip(r.raw.iter_mut()) {
                    let mut figures = json!({
                        "figures": phases_json(phases),
                        "ratio_to_mutex_p50": phase_ratios(0.5, phases, base),
                        "ratio_to_mutex_p99": phase_ratios(0.99, phases, base),
                    });
                    if let Some(raw) = raw {
                        figures["ratio_to_rawq_rw_p50"] = phase_ratios(0.5, phases, raw);
                        figures["ratio_to_rawq_rw_p99"] = phase_ratios(0.99, phases, raw);
                        figures["rawq_rw"] = phases_json(raw);
                    }
                    fields.insert(kind.name().into(), figures);
                }
                fields.insert("mutex".into(), phases_json(base));
                serde_json::Value::Object(fields)
            })
            .collect();
        let downgrade: Vec<serde_json::Value> = self
            .downgrade
            .iter_mut()
            .map(|r| {
                json!({
                    "n": r.n,
                    "downgrade": summary_json(r.downgrade.summary()),
                    "extend": summary_json(r.extend.summary()),
                    "ratio_p50": ratio(r.downgrade.quantile(0.5), r.extend.quantile(0.5)),
                    "ratio_p99": ratio(r.downgrade.quantile(0.99), r.extend.quantile(0.99)),
                    "errors": r.errors,
                })
            })
            .collect();
        let handoff: Vec<serde_json::Value> = self
            .handoff
            .iter_mut()
            .map(|h| {
                json!({
                    "n": h.n,
                    "threads": h.threads,
                    "fair": h.fair,
                    "hold_ms": HANDOFF_HOLD.as_millis() as u64,
                    "gap": summary_json(h.gaps.summary()),
                    "gap_histogram": histogram_json(&h.gaps),
                    "regrants": h.regrants,
                    "overlaps": h.overlaps,
                    "errors": h.errors,
                })
            })
            .collect();
        let scale = self.scale.as_ref().map(|plan| {
            json!({
                "cell_s": plan.cell.as_secs_f64(),
                "rounds": plan.rounds,
                "ours_top_to_t1_ops": scale_ratio(&self.threads).map(|(_, r)| r),
            })
        });
        let threads: Vec<serde_json::Value> = self
            .threads
            .iter_mut()
            .map(|t| {
                json!({
                    "n": t.n,
                    "threads": t.threads,
                    "ratio_ops_ours_to_raw_n": rate_ratio(t.ours.ops_per_sec(), t.raw.ops_per_sec()),
                    "masters_per_node": t.masters,
                    "ours": t.ours.json(),
                    "raw_n": if t.raw_skipped { serde_json::Value::Null } else { t.raw.json() },
                })
            })
            .collect();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "nodes": self.origin,
            "iters": self.iters,
            "block": BLOCK,
            "ttl_ms": TTL.as_millis() as u64,
            "mutex": mutex,
            "rw": rw,
            "downgrade": downgrade,
            "handoff": handoff,
            "threads": threads,
            "scale": scale,
        })
    }
}

/// Ratios of `ours` to `base` at quantile `q`, per phase.
fn phase_ratios(q: f64, ours: &mut Phases, base: &mut Phases) -> serde_json::Value {
    json!({
        "acquire": ratio(ours.acquire.quantile(q), base.acquire.quantile(q)),
        "release": ratio(ours.release.quantile(q), base.release.quantile(q)),
        "cycle": ratio(ours.cycle.quantile(q), base.cycle.quantile(q)),
    })
}

/// Rows of p50 and p99 for `ours` next to `base`, with their ratios, one per phase.
fn print_ratio_rows(
    out: &mut dyn Write,
    n: usize,
    ours: &mut Phases,
    base: &mut Phases,
) -> io::Result<()> {
    for (name, o, b) in [
        ("acquire", &mut ours.acquire, &mut base.acquire),
        ("release", &mut ours.release, &mut base.release),
        ("cycle", &mut ours.cycle, &mut base.cycle),
    ] {
        let (o, b) = (o.summary(), b.summary());
        writeln!(
            out,
            "{:>2}  {:<8} {:>10} {:>10} {:>6.3}x   {:>10} {:>10} {:>6.3}x",
            n,
            name,
            fmt_duration(o.p50),
            fmt_duration(b.p50),
            ratio(o.p50, b.p50),
            fmt_duration(o.p99),
            fmt_duration(b.p99),
            ratio(o.p99, b.p99),
        )?;
    }
    Ok(())
}

/// The full figures of each measured client, one row per phase.
fn print_detail_rows(
    out: &mut dyn Write,
    n: usize,
    who: &str,
    phases: &mut Phases,
) -> io::Result<()> {
    let errors = phases.errors;
    for (name, s) in [
        ("acquire", &mut phases.acquire),
        ("release", &mut phases.release),
        ("cycle", &mut phases.cycle),
    ] {
        let sum = s.summary();
        let cycle = name == "cycle";
        writeln!(
            out,
            "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
            n,
            who,
            name,
            fmt_duration(sum.p50),
            fmt_duration(sum.p90),
            fmt_duration(sum.p99),
            fmt_duration(sum.p999),
            fmt_duration(sum.max),
            if cycle {
                format!("{:.0}", sum.ops_per_sec())
            } else {
                String::new()
            },
            if cycle {
                errors.to_string()
            } else {
                String::new()
            },
        )?;
    }
    Ok(())
}

fn print_detail_header(out: &mut dyn Write, who: &str) -> io::Result<()> {
    writeln!(
        out,
        "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "N", who, "op", "p50", "p90", "p99", "p99.9", "max", "ops/s", "errors"
    )?;
    Ok(())
}

fn print_mutex(
    out: &mut dyn Write,
    origin: &str,
    iters: usize,
    results: &mut [MutexResult],
) -> io::Result<()> {
    writeln!(
        out,
        "mutex, uncontended: {origin}; {iters} cycles per client per N, in alternating blocks of {BLOCK}"
    )?;
    writeln!(out, "ours = redlock_mux::Client; baseline = SET NX PX to all N sockets, then all N replies; release = EVALSHA compare-and-delete")?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>2}  {:<8} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
        "N", "op", "ours p50", "base p50", "ratio", "ours p99", "base p99", "ratio"
    )?;
    for r in results.iter_mut() {
        print_ratio_rows(out, r.n, &mut r.ours, &mut r.baseline)?;
    }
    writeln!(out)?;
    print_detail_header(out, "client")?;
    for r in results.iter_mut() {
        print_detail_rows(out, r.n, "ours", &mut r.ours)?;
        print_detail_rows(out, r.n, "baseline", &mut r.baseline)?;
    }
    if let Some(last) = results.last() {
        writeln!(out)?;
        writeln!(out, "cycle latency at N={}, ours:", last.n)?;
        write!(out, "{}", last.ours.cycle.histogram().render(14, 40))?;
        writeln!(out, "cycle latency at N={}, baseline:", last.n)?;
        write!(out, "{}", last.baseline.cycle.histogram().render(14, 40))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "goals: acquire p50 <= baseline; cycle p50 <= 1.05 x baseline"
    )?;
    for r in results.iter_mut() {
        let a = ratio(
            r.ours.acquire.quantile(0.5),
            r.baseline.acquire.quantile(0.5),
        );
        let c = ratio(r.ours.cycle.quantile(0.5), r.baseline.cycle.quantile(0.5));
        writeln!(
            out,
            "  N={}: acquire p50 {:.3}x [{}], cycle p50 {:.3}x [{}]",
            r.n,
            a,
            met(a <= 1.0),
            c,
            met(c <= 1.05),
        )?;
    }
    Ok(())
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "missed"
    }
}

fn print_rw(
    out: &mut dyn Write,
    origin: &str,
    iters: usize,
    results: &mut [RwResult],
) -> io::Result<()> {
    let any_raw = results.iter().any(|r| r.raw.iter().any(Option::is_some));
    let any_sem = results
        .iter()
        .any(|r| r.kinds.iter().any(|(k, _)| *k == Kind::Semaphore));
    writeln!(out)?;
    writeln!(
        out,
        "other lock kinds, uncontended, next to {}the mutex: {origin}; {iters} cycles per client per N, in rotating blocks of {BLOCK}",
        if any_raw { "rawQ-rw (read and write) and " } else { "" }
    )?;
    writeln!(
        out,
        "each cycle: try_read_lock / try_write_lock / try_acquire of a {SEM_PERMITS}-permit semaphore / try_lock, then release"
    )?;
    if any_raw {
        writeln!(
            out,
            "rawQ-rw = the read-write design's acquire script by EVALSHA to all N sockets, returning at the quorum (release: ZREM / compare-and-delete, each announced as ours are)"
        )?;
        writeln!(out, "ratios: kind / rawQ-rw, kind / mutex")?;
    } else {
        writeln!(out, "ratio = kind / mutex")?;
    }
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for ((kind, phases), raw) in rest.iter_mut().zip(r.raw.iter_mut()) {
            writeln!(out)?;
            let Some(raw) = raw else {
                writeln!(
                    out,
                    "{:>2}  {:<8} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
                    "N",
                    "op",
                    format!("{} p50", kind.name()),
                    "mutex p50",
                    "ratio",
                    format!("{} p99", kind.name()),
                    "mutex p99",
                    "ratio"
                )?;
                print_ratio_rows(out, r.n, phases, mutex)?;
                continue;
            };
            writeln!(
                out,
                "{:>2}  {:<8} {:>10} {:>11} {:>7} {:>10} {:>7}   {:>10} {:>11} {:>7} {:>10} {:>7}",
                "N",
                "op",
                format!("{} p50", kind.name()),
                "rawQ-rw p50",
                "ratio",
                "mutex p50",
                "ratio",
                format!("{} p99", kind.name()),
                "rawQ-rw p99",
                "ratio",
                "mutex p99",
                "ratio"
            )?;
            for (name, o, q, m) in [
                (
                    "acquire",
                    &mut phases.acquire,
                    &mut raw.acquire,
                    &mut mutex.acquire,
                ),
                (
                    "release",
                    &mut phases.release,
                    &mut raw.release,
                    &mut mutex.release,
                ),
                ("cycle", &mut phases.cycle, &mut raw.cycle, &mut mutex.cycle),
            ] {
                let (o, q, m) = (o.summary(), q.summary(), m.summary());
                writeln!(
                    out,
                    "{:>2}  {:<8} {:>10} {:>11} {:>6.3}x {:>10} {:>6.3}x   {:>10} {:>11} {:>6.3}x {:>10} {:>6.3}x",
                    r.n,
                    name,
                    fmt_duration(o.p50),
                    fmt_duration(q.p50),
                    ratio(o.p50, q.p50),
                    fmt_duration(m.p50),
                    ratio(o.p50, m.p50),
                    fmt_duration(o.p99),
                    fmt_duration(q.p99),
                    ratio(o.p99, q.p99),
                    fmt_duration(m.p99),
                    ratio(o.p99, m.p99),
                )?;
            }
        }
    }
    writeln!(out)?;
    print_detail_header(out, "client")?;
    for r in results.iter_mut() {
        for (kind, phases) in r.kinds.iter_mut() {
            print_detail_rows(out, r.n, kind.name(), phases)?;
        }
        for ((kind, _), raw) in r.kinds[1..].iter().zip(r.raw.iter_mut()) {
            let Some(raw) = raw else { continue };
            let who = if *kind == Kind::Read {
                "rawQ-r"
            } else {
                "rawQ-w"
            };
            print_detail_rows(out, r.n, who, raw)?;
        }
    }
    writeln!(out)?;
    let mut goals = Vec::new();
    if any_raw {
        goals.push(format!(
            "on Redis 7, read and write acquire p50 within {RW_RAW_TARGET}x of rawQ-rw at N=5; \
             where the server offers a path without Lua, read and write acquire and cycle p50 \
             within {RW_TARGET}x of the mutex"
        ));
    }
    if any_sem {
        goals.push(format!(
            "semaphore acquire and cycle p50 within {SEM_TARGET}x of the mutex"
        ));
    }
    writeln!(out, "goals: {}", goals.join("; "))?;
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for ((kind, phases), raw) in rest.iter_mut().zip(r.raw.iter_mut()) {
            let a = ratio(phases.acquire.quantile(0.5), mutex.acquire.quantile(0.5));
            let c = ratio(phases.cycle.quantile(0.5), mutex.cycle.quantile(0.5));
            let target = kind.target();
            match raw {
                Some(raw) => {
                    let q = ratio(phases.acquire.quantile(0.5), raw.acquire.quantile(0.5));
                    writeln!(
                        out,
                        "  N={} {:<9}: acquire p50 {:.3}x rawQ-rw [{}], {:.3}x mutex [{}]; cycle p50 {:.3}x mutex [{}]",
                        r.n,
                        kind.name(),
                        q,
                        met(q <= RW_RAW_TARGET),
                        a,
                        met(a <= target),
                        c,
                        met(c <= target),
                    )?;
                }
                None => {
                    writeln!(
                        out,
                        "  N={} {:<9}: acquire p50 {:.3}x mutex [{}]; cycle p50 {:.3}x mutex [{}]",
                        r.n,
                        kind.name(),
                        a,
                        met(a <= target),
                        c,
                        met(c <= target),
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn print_handoff(
    out: &mut dyn Write,
    origin: &str,
    results: &mut [HandoffResult],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "contended hand-off: {origin}; each thread loops lock -> hold {} -> release for {}",
        fmt_duration(HANDOFF_HOLD),
        fmt_duration(HANDOFF_RUN)
    )?;
    writeln!(
        out,
        "gap = another thread's lock returning - the holder starting its release (first {} not counted)",
        fmt_duration(HANDOFF_WARMUP)
    )?;
    writeln!(
        out,
        "{:>2}  {:<6} {:>7}  {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6}",
        "N",
        "client",
        "threads",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max",
        "handoffs",
        "regrants",
        "overlaps",
        "errors"
    )?;
    for h in results.iter_mut() {
        let s = h.gaps.summary();
        writeln!(
            out,
            "{:>2}  {:<6} {:>7}  {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6}",
            h.n,
            if h.fair { "fair" } else { "plain" },
            h.threads,
            fmt_duration(s.p50),
            fmt_duration(s.p90),
            fmt_duration(s.p99),
            fmt_duration(s.p999),
            fmt_duration(s.max),
            s.count,
            h.regrants,
            h.overlaps,
            h.errors
        )?;
    }
    let (p50_target, p99_target) = HANDOFF_TARGET;
    writeln!(out)?;
    writeln!(
        out,
        "goals: gap p50 < {}, p99 < {}",
        fmt_duration(p50_target),
        fmt_duration(p99_target)
    )?;
    for h in results.iter_mut() {
        let (p50, p99) = (h.gaps.quantile(0.5), h.gaps.quantile(0.99));
        writeln!(
            out,
            "  N={} {:<5} x{}: p50 {} [{}], p99 {} [{}]",
            h.n,
            if h.fair { "fair" } else { "plain" },
            h.threads,
            fmt_duration(p50),
            met(!h.gaps.is_empty() && p50 < p50_target),
            fmt_duration(p99),
            met(!h.gaps.is_empty() && p99 < p99_target),
        )?;
    }
    Ok(())
}

fn print_threads(
    out: &mut dyn Write,
    origin: &str,
    plan: &ScalePlan,
    results: &mut [ThreadsResult],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "threads on distinct keys, try_lock + release in a loop: {origin}; {} per cell, {} round{}, ours and rawN in alternating order",
        fmt_duration(plan.cell),
        plan.rounds,
        if plan.rounds == 1 { "" } else { "s" }
    )?;
    writeln!(
        out,
        "ours = one redlock_mux::Client shared by the threads; rawN = the raw baseline with a connection set per thread, returning at the quorum"
    )?;
    writeln!(
        out,
        "ops/s: median of the rounds; latencies: every cycle of every round; conns/node: most connections on any node during a cell (CLIENT LIST, not the probe's), subs: of which pub/sub; cpu/cycle: servers' user+sys CPU over all nodes per cycle (median of the rounds)"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>2} {:>7} {:<6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>4} {:>9}",
        "N",
        "threads",
        "client",
        "ops/s",
        "acq p50",
        "acq p99",
        "cyc p50",
        "cyc p99",
        "failed",
        "conns/node",
        "subs",
        "cpu/cycle"
    )?;
    for t in results.iter_mut() {
        let skipped = t.raw_skipped;
        for (who, f) in [("ours", &mut t.ours), ("rawN", &mut t.raw)] {
            if who == "rawN" && skipped {
                continue;
            }
            let (a, c) = (f.acquire.summary(), f.cycle.summary());
            writeln!(
                out,
                "{:>2} {:>7} {:<6} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>4} {:>9}",
                t.n,
                t.threads,
                who,
                f.ops_per_sec(),
                fmt_duration(a.p50),
                fmt_duration(a.p99),
                fmt_duration(c.p50),
                fmt_duration(c.p99),
                f.failed(),
                f.connections(),
                f.subscribers(),
                format!("{:.1}µs", f.cpu_us_per_cycle()),
            )?;
        }
    }
    if let Some(t) = results
        .iter()
        .find(|t| t.masters.iter().any(|&m| m > 1) || t.raw_skipped)
    {
        writeln!(out)?;
        writeln!(
            out,
            "Redis Cluster nodes: masters per node {:?}; rawN left out (it addresses one server per node); {SPREAD_KEYS} keys per thread, so that slots spread",
            t.masters
        )?;
        writeln!(
            out,
            "cpu/cycle per master (ours, INFO cpu of each master, median of the rounds), by node:"
        )?;
        for t in results.iter() {
            let by = t.ours.cpu_us_per_cycle_by_server();
            let mut at = 0;
            let nodes: Vec<String> = t
                .masters
                .iter()
                .map(|&m| {
                    let part = by.get(at..at + m).unwrap_or(&[]);
                    at += m;
                    let each: Vec<String> = part.iter().map(|c| format!("{c:.1}")).collect();
                    format!("[{}]", each.join(" "))
                })
                .collect();
            let total: usize = t.masters.iter().sum();
            writeln!(
                out,
                "  T={:<4} {} µs; mean per master {:.1}µs",
                t.threads,
                nodes.join(" "),
                t.ours.cpu_us_per_cycle() / total.max(1) as f64
            )?;
        }
    }
    let raw_skipped = results.iter().any(|t| t.raw_skipped);
    writeln!(out)?;
    if !raw_skipped {
        writeln!(out, "ratios (ours ÷ rawN: ops/s; cycle p50, p99):")?;
    }
    for t in results.iter_mut().filter(|_| !raw_skipped) {
        writeln!(
            out,
            "  T={:<4} ops/s {:.2}x; cycle p50 {:.2}x, p99 {:.2}x",
            t.threads,
            rate_ratio(t.ours.ops_per_sec(), t.raw.ops_per_sec()),
            ratio(t.ours.cycle.quantile(0.5), t.raw.cycle.quantile(0.5)),
            ratio(t.ours.cycle.quantile(0.99), t.raw.cycle.quantile(0.99)),
        )?;
    }
    if let Some((top, one)) = scale_ratio(results) {
        writeln!(out, "  ours at T={top} ÷ ours at T=1, ops/s: {one:.2}x")?;
    }
    let failed: Vec<_> = results
        .iter()
        .flat_map(|t| {
            [("ours", &t.ours), ("rawN", &t.raw)]
                .into_iter()
                .filter(|(_, f)| !f.failures.is_empty())
                .map(move |(who, f)| (t.threads, who, f))
        })
        .collect();
    if !failed.is_empty() {
        writeln!(out)?;
        writeln!(out, "failed calls:")?;
        for (threads, who, f) in failed {
            for (why, count) in &f.failures {
                writeln!(out, "  T={threads} {who}: {count} x {why}")?;
            }
        }
    }
    Ok(())
}

/// `a / b` for rates; 0 when `b` is zero.
fn rate_ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Ours at the largest T measured ÷ ours at T = 1, in ops/s, when both were measured: the
/// largest T and the ratio.
fn scale_ratio(results: &[ThreadsResult]) -> Option<(usize, f64)> {
    let one = results.iter().find(|t| t.threads == 1)?;
    let top = results.iter().max_by_key(|t| t.threads)?;
    (top.threads > 1).then(|| {
        (
            top.threads,
            rate_ratio(top.ours.ops_per_sec(), one.ours.ops_per_sec()),
        )
    })
}

/// A client's figures: each phase's summary, the cycle histogram, ops/s and errors.
fn phases_json(p: &mut Phases) -> serde_json::Value {
    let cycle: Summary = p.cycle.summary();
    json!({
        "acquire": summary_json(p.acquire.summary()),
        "release": summary_json(p.release.summary()),
        "cycle": summary_json(cycle),
        "cycle_histogram": histogram_json(&p.cycle),
        "ops_per_sec": cycle.ops_per_sec(),
        "errors": p.errors,
    })
}

/// A latency summary, in microseconds.
fn summary_json(s: Summary) -> serde_json::Value {
    json!({
        "count": s.count,
        "mean_us": us(s.mean),
        "p50_us": us(s.p50),
        "p90_us": us(s.p90),
        "p99_us": us(s.p99),
        "p999_us": us(s.p999),
        "max_us": us(s.max),
    })
}

/// The histogram's buckets: `[low, high)` in nanoseconds, and the count.
fn histogram_json(samples: &Samples) -> serde_json::Value {
    samples
        .histogram()
        .rows
        .iter()
        .map(|r| json!([r.low.as_nanos() as u64, r.high.as_nanos() as u64, r.count]))
        .collect()
}
