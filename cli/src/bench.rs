//! `redlock-mux bench`: lock latency against given nodes or local `redis-server` processes it
//! starts, next to a baseline measured in the same run.
//!
//! - `mutex`: the mutex next to the raw baseline ([`crate::raw`]), the least a Redlock client
//!   can do on the wire: `SET key token NX PX ttl` written to all N blocking sockets, then all N
//!   replies read; release by a compare-and-delete script sent the same way.
//! - `read`, `write`: read and write locks next to `rawQ-rw` ([`crate::raw::RawQRw`], the ideal
//!   client of seed 000's read-write lock: its scripts by `EVALSHA` to all N sockets at once,
//!   returning at the quorum) and to the library's own mutex.
//! - `handoff`: threads contending for one lock, each holding it for 1 ms; the figure is the
//!   gap from one thread's release to another's acquire.
//! - `threads`: T threads on distinct keys, sharing one client; aggregate operations per
//!   second and cycle latency, at each T.
//!
//! Whatever is compared runs in alternating blocks, so a change in machine load during the
//! run hits both alike; their ratio is the figure to watch.
//!
//! Output goes through one writer, so a reader that goes away (`bench | head`) ends the
//! command quietly.

use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Client, Error, NodeUrl};
use serde_json::json;

use crate::args::{self, usage, NodesFrom};
use crate::local_servers::RedisCluster;
use crate::raw::{Raw, RawQRw, Side, Target, Tokens};
use crate::stats::{fmt_duration, ratio, us, Samples, Summary};
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux bench [--nodes URLS | --instances N] [--iters N]
                         [--mode mutex|read|write|handoff|threads|all]
                         [--threads T,T,...] [--json]

Measures lock latency: acquire, release and the whole cycle (p50, p90, p99,
p99.9, max), ops/s and a histogram.

Modes:
  mutex     (default) the mutex next to a raw baseline (SET NX PX to all N
            sockets, then all N replies; release by compare-and-delete), in
            alternating blocks, at N = 1, 3 and 5
  read      read locks next to rawQ-rw (seed 000's read acquire script by
            EVALSHA to all N sockets at once, returning at the quorum; release
            by ZREM and an announcement) and to the mutex, in rotating blocks,
            at the largest N (5 by default)
  write     write locks likewise (seed 000's write acquire script; release by
            compare-and-delete)
  handoff   contended hand-off at the largest N: 2, then 8 threads loop lock,
            hold 1 ms, release for 3 s each; the figure is the gap from one
            thread starting its release to another's lock returning. Measured
            with plain and with fair (FIFO) clients
  threads   scale: T threads on distinct keys share one client at the largest
            N; aggregate ops/s and cycle latency (p50, p99) for each T
            (default 1, 4, 16 and 64; --iters cycles in all per T)
  all       every mode above

Nodes: --nodes, else REDLOCK_NODES, names existing servers to use (the keys
it writes start with redlock-mux:bench:). Without either, or with
--instances, it starts N local redis-server processes (default 5) on free
loopback ports, with temporary directories and no persistence, and stops them
on exit. The mutex is measured at N = 1, 3 and 5 (those not above the number of
nodes, and the number of nodes itself), on the first N nodes; read and write
locks at the number of nodes.

Options:
  --nodes URLS      comma-separated node URLs of servers to use
                    (default: $REDLOCK_NODES)
  --instances N     start N local servers instead (default 5)
  --iters N         measured cycles per lock kind per N (default 20000)
  --mode MODE       mutex, read, write, handoff, threads or all (see above)
  --threads LIST    thread counts for the threads mode, e.g. 1,8,32; implies
                    --mode threads unless --mode is given
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
/// Contending threads in the hand-off runs.
const HANDOFF_THREADS: [usize; 2] = [2, 8];
/// The hand-off goals: p50 and p99 of the gap.
const HANDOFF_TARGET: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(5));
/// The read-write goal where the server runs no Lua for them (Redis 8.2 and later): read and
/// write within this factor of the mutex.
const RW_TARGET: f64 = 1.1;
/// The read-write goal on Redis 7, where both run a script: read and write within this factor of
/// `rawQ-rw`, the ideal client of the seed's scripts.
const RW_RAW_TARGET: f64 = 1.05;

/// A lock kind measured against the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Read => "read",
            Kind::Write => "write",
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
    while let Some(arg) = parser.next()? {
        match arg {
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("instances") => instances = Some(args::count("--instances", parser.value()?)?),
            Long("iters") => iters = args::count("--iters", parser.value()?)?,
            Long("mode") => mode = Some(args::text("--mode", parser.value()?)?),
            Long("threads") => thread_counts = Some(counts(parser.value()?)?),
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
        "handoff" => (false, &[], true, false),
        "threads" => (false, &[], false, true),
        "all" => (true, &[Kind::Read, Kind::Write], true, true),
        other => return Err(usage!("--mode: unknown mode {other:?}").into()),
    };
    let thread_counts = thread_counts.unwrap_or_else(|| THREADS.to_vec());
    if nodes.is_some() && instances.is_some() {
        return Err(usage!("give either --nodes or --instances, not both").into());
    }
    let given = match instances {
        Some(_) => None,
        None => args::nodes_or_none(nodes)?,
    };

    // Declared before the figures so the servers outlive every client using them.
    let cluster;
    let (urls, origin) = match given {
        Some((urls, from)) => {
            // Read with the library's parser now, for a usage error before anything runs.
            for url in &urls {
                NodeUrl::parse(url).map_err(|e| usage!("{e}"))?;
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
            if !json {
                eprintln!("starting {n} local redis-server instances...");
            }
            cluster = RedisCluster::start(n)
                .map_err(|e| Fail::other(format!("could not start redis-server: {e}")))?;
            (cluster.urls(), format!("{n} local redis-server instances"))
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
        // Read-write locks at the largest N only (5 by default), where the targets are.
        if !rw_kinds.is_empty() && n == urls.len() {
            report.rw.push(bench_rw(nodes, iters, rw_kinds, &progress)?);
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
        for &threads in &thread_counts {
            report
                .threads
                .push(bench_threads(&urls, threads, iters, &progress)?);
        }
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
    handoff: Vec<HandoffResult>,
    threads: Vec<ThreadsResult>,
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

/// Read and/or write lock figures at one N, next to `rawQ-rw` and the mutex measured in the
/// same run.
struct RwResult {
    n: usize,
    /// The mutex first, then each kind measured.
    kinds: Vec<(Kind, Phases)>,
    /// `rawQ-rw` for each kind measured, in the order of `kinds[1..]`.
    raw: Vec<Phases>,
}

/// Who runs one block of a read-write benchmark.
#[derive(Debug, Clone, Copy)]
enum RwClient {
    /// The library: `kinds[i]`.
    Ours(usize),
    /// `rawQ-rw`, as the kind `kinds[i + 1]`.
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
    let mut raw = RawQRw::connect_targets(&targets(urls)?)
        .map_err(|e| Fail::other(format!("rawQ-rw could not connect: {e}")))?;
    let mut tokens = Tokens::new();
    let mut measured: Vec<(Kind, Phases)> = std::iter::once(Kind::Mutex)
        .chain(kinds.iter().copied())
        .map(|k| (k, Phases::with_capacity(iters)))
        .collect();
    let mut raw_measured: Vec<Phases> =
        kinds.iter().map(|_| Phases::with_capacity(iters)).collect();
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
        .chain((0..kinds.len()).map(RwClient::Raw))
        .collect();
    let mut run = |who: RwClient,
                   count: usize,
                   scratch: bool,
                   measured: &mut [(Kind, Phases)],
                   raw_measured: &mut [Phases]|
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
                let into = if scratch {
                    &mut sink
                } else {
                    &mut raw_measured[i]
                };
                let (r, w) = raw_keys(kind);
                raw_rw_cycles(&mut raw, &mut tokens, kind, (&r, &w), count, into)?;
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

/// `count` cycles of `rawQ-rw` as `kind` (read or write) on the keys `(r, w)`: acquire, then
/// release.
fn raw_rw_cycles(
    raw: &mut RawQRw,
    tokens: &mut Tokens,
    kind: Kind,
    (r, w): (&str, &str),
    count: usize,
    into: &mut Phases,
) -> Result<(), Fail> {
    let side = if kind == Kind::Read {
        Side::Read
    } else {
        Side::Write
    };
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
                addr: url.addr(),
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

/// `threads` threads, each with its own clone of one client (so its own connections), loop
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

/// Scale figures for one thread count.
struct ThreadsResult {
    n: usize,
    threads: usize,
    cycles: usize,
    wall: Duration,
    cycle: Samples,
    errors: u64,
}

impl ThreadsResult {
    fn ops_per_sec(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.cycles as f64 / secs
        } else {
            0.0
        }
    }
}

/// `threads` threads share one client (its pool gives each its own connections) and loop
/// try-lock → release on a key of their own, `iters` cycles in all. The figures are the
/// cycles' latencies and the aggregate rate, from the moment all threads start together to
/// the last one's end.
fn bench_threads(
    urls: &[String],
    threads: usize,
    iters: usize,
    progress: &Progress,
) -> Result<ThreadsResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let per_thread = iters.div_ceil(threads);
    let label = format!("threads x{threads}");
    progress.show(&label, 0, 1);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            let barrier = barrier.clone();
            let key = format!("redlock-mux:bench:threads:{n}:{threads}:{t}");
            thread::spawn(move || {
                let mut warmup = Phases::default();
                ours_cycles(&client, Kind::Mutex, &key, 20, &mut warmup);
                barrier.wait();
                let mut phases = Phases::with_capacity(per_thread);
                ours_cycles(&client, Kind::Mutex, &key, per_thread, &mut phases);
                (phases.cycle, phases.errors, Instant::now())
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut result = ThreadsResult {
        n,
        threads,
        cycles: 0,
        wall: Duration::ZERO,
        cycle: Samples::with_capacity(per_thread * threads),
        errors: 0,
    };
    let mut end = start;
    for w in workers {
        let (cycle, errors, done) = w
            .join()
            .map_err(|_| Fail::other("a benchmark thread panicked".into()))?;
        result.cycle.extend(&cycle);
        result.errors += errors;
        end = end.max(done);
    }
    result.cycles = result.cycle.len();
    result.wall = end - start;
    progress.show(&label, 1, 1);
    Ok(result)
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
        if !self.handoff.is_empty() {
            print_handoff(out, origin, &mut self.handoff)?;
        }
        if !self.threads.is_empty() {
            print_threads(out, origin, self.iters, &mut self.threads)?;
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
                    fields.insert(
                        kind.name().into(),
                        json!({
                            "figures": phases_json(phases),
                            "ratio_to_mutex_p50": phase_ratios(0.5, phases, base),
                            "ratio_to_mutex_p99": phase_ratios(0.99, phases, base),
                            "ratio_to_rawq_rw_p50": phase_ratios(0.5, phases, raw),
                            "ratio_to_rawq_rw_p99": phase_ratios(0.99, phases, raw),
                            "rawq_rw": phases_json(raw),
                        }),
                    );
                }
                fields.insert("mutex".into(), phases_json(base));
                serde_json::Value::Object(fields)
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
        let threads: Vec<serde_json::Value> = self
            .threads
            .iter_mut()
            .map(|t| {
                json!({
                    "n": t.n,
                    "threads": t.threads,
                    "cycles": t.cycles,
                    "wall_s": t.wall.as_secs_f64(),
                    "ops_per_sec": t.ops_per_sec(),
                    "cycle": summary_json(t.cycle.summary()),
                    "cycle_histogram": histogram_json(&t.cycle),
                    "errors": t.errors,
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
            "handoff": handoff,
            "threads": threads,
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
    writeln!(out)?;
    writeln!(
        out,
        "read-write locks, uncontended, next to rawQ-rw and the mutex: {origin}; {iters} cycles per client per N, in rotating blocks of {BLOCK}"
    )?;
    writeln!(
        out,
        "each cycle: try_read_lock / try_write_lock / try_lock, then release; rawQ-rw = seed 000's acquire script by EVALSHA to all N sockets, returning at the quorum (release: ZREM / compare-and-delete, each announced as ours are)"
    )?;
    writeln!(out, "ratios: kind / rawQ-rw, kind / mutex")?;
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for ((kind, phases), raw) in rest.iter_mut().zip(r.raw.iter_mut()) {
            writeln!(out)?;
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
            let who = if *kind == Kind::Read {
                "rawQ-r"
            } else {
                "rawQ-w"
            };
            print_detail_rows(out, r.n, who, raw)?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "goals: on Redis 7, read and write acquire p50 within {RW_RAW_TARGET}x of rawQ-rw at N=5; \
         where the server offers a path without Lua, within {RW_TARGET}x of the mutex"
    )?;
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for ((kind, phases), raw) in rest.iter_mut().zip(r.raw.iter_mut()) {
            let q = ratio(phases.acquire.quantile(0.5), raw.acquire.quantile(0.5));
            let a = ratio(phases.acquire.quantile(0.5), mutex.acquire.quantile(0.5));
            let c = ratio(phases.cycle.quantile(0.5), mutex.cycle.quantile(0.5));
            writeln!(
                out,
                "  N={} {:<5}: acquire p50 {:.3}x rawQ-rw [{}], {:.3}x mutex [{}]; cycle p50 {:.3}x mutex [{}]",
                r.n,
                kind.name(),
                q,
                met(q <= RW_RAW_TARGET),
                a,
                met(a <= RW_TARGET),
                c,
                met(c <= RW_TARGET),
            )?;
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
    iters: usize,
    results: &mut [ThreadsResult],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "threads on distinct keys, one shared client: {origin}; {iters} try_lock + release cycles in all per T"
    )?;
    writeln!(
        out,
        "{:>2}  {:>7}  {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "N", "threads", "ops/s", "p50", "p99", "p99.9", "max", "errors"
    )?;
    for t in results.iter_mut() {
        let ops = t.ops_per_sec();
        let s = t.cycle.summary();
        writeln!(
            out,
            "{:>2}  {:>7}  {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>6}",
            t.n,
            t.threads,
            ops,
            fmt_duration(s.p50),
            fmt_duration(s.p99),
            fmt_duration(s.p999),
            fmt_duration(s.max),
            t.errors
        )?;
    }
    Ok(())
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
