//! `redlock-mux bench`: lock latency against given nodes or local `redis-server` processes it
//! starts, next to a baseline measured in the same run.
//!
//! - `mutex`: the mutex next to the raw baseline ([`crate::raw`]), the least a Redlock client
//!   can do on the wire: `SET key token NX PX ttl` written to all N blocking sockets, then all N
//!   replies read; release by a compare-and-delete script sent the same way.
//! - `read`, `write`: read and write locks next to `rawQ-rw` ([`crate::raw::RawQRw`], the ideal
//!   client of the read-write lock design: its scripts by `EVALSHA` to all N sockets at once,
//!   returning at the quorum) and to the library's own mutex.
//! - `semaphore`: a semaphore of 2 permits next to the mutex (at N = 5 one slot per node, one
//!   key per node taken with the mutex's own command, and a quorum of 2 of 5 nodes).
//! - `downgrade`: a write lock's downgrade next to a mutex extend.
//! - `handoff`: threads contending for one lock, each holding it for 1 ms; the figure is the
//!   gap from one thread's release to another's acquire.
//! - `threads`: T threads on distinct keys, sharing one client, next to `rawN` (the raw
//!   baseline with a connection set per thread, returning at the quorum); for each T and each
//!   client, timed cells of a few seconds: aggregate operations per second, acquire and cycle
//!   latency, failed calls, connections per node and server CPU per cycle (both from the
//!   servers themselves: `CLIENT LIST`, `INFO cpu`).
//!
//! - `--sentinel`: the mutex on Sentinel-managed members and on members with `?wait=1`, next
//!   to plain members, on servers it starts (see [`sentinel`]).
//!
//! Whatever is compared runs in alternating blocks, so a change in machine load during the
//! run hits both alike; their ratio is the figure to watch. The command prints comparisons,
//! never verdicts: what a figure should be is the project's business (`benches/`), not the
//! user's.
//!
//! One module per mode; `phases` holds what they share.
//!
//! Output goes through one writer, so a reader that goes away (`bench | head`) ends the
//! command quietly.

use std::io::{self, IsTerminal, Write};
use std::time::Duration;

use redlock_mux::NodeUrl;
use serde_json::json;

use crate::args::{self, usage, NodesFrom};
use crate::local_servers::RedisCluster;
use crate::Fail;

mod downgrade;
mod handoff;
mod kinds;
mod mutex;
mod phases;
mod sentinel;
mod threads;
#[cfg(feature = "tls")]
mod tls;

pub(crate) use phases::node_stats_json;
use phases::Kind;

const HELP: &str = "\
Usage: redlock-mux bench [--nodes URLS | --instances N [--server PATH]] [--iters N]
                         [--mode mutex|read|write|semaphore|downgrade|handoff|threads|all]
                         [--threads T,T,...] [--duration D] [--rounds R]
                         [--json]
       redlock-mux bench --tls [--instances N] [--server PATH] [--iters N] [--json]
       redlock-mux bench --sentinel [--instances N] [--iters N] [--json]

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
            blocks, at N = 1, 3 and 5 (with one slot per node at N = 5, one key
            per node as the mutex's, its quorum is 2 of 5 nodes, where the mutex
            needs 3, and a release needs 4; 3 of 3 at N = 3)
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

Sentinel: with --sentinel, it starts N members of three kinds (default 3 of
each): plain servers; masters with a replica each, named with ?wait=1; and
masters managed by Redis Sentinel (a master, a replica and three sentinels
each, named by redis+sentinel:// URLs), all of the default server binary
($REDLOCK_MUX_REDIS_SERVER, else redis-server on PATH). It measures the mutex
on each, in rotating blocks: acquire and cycle p50 and p99, and their ratios
to the plain members. --iters 5000 keeps it to a few seconds per kind.

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
  --sentinel        measure Sentinel members and ?wait=1 against plain members
                    (see Sentinel above)
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
/// Thread counts of the threads mode, unless given.
const THREADS: [usize; 4] = [1, 4, 16, 64];
/// Length of one threads-mode cell, unless given.
const CELL: Duration = Duration::from_secs(3);
/// Rounds of threads-mode cells, unless given.
const ROUNDS: usize = 3;

/// What the command line asked for.
struct Options {
    nodes: Option<String>,
    instances: Option<usize>,
    server: Option<std::path::PathBuf>,
    tls: bool,
    sentinel: bool,
    iters: usize,
    mode: String,
    modes: Modes,
    threads: Vec<usize>,
    cell: Duration,
    rounds: usize,
    json: bool,
}

/// Which measurements a mode runs.
#[derive(Clone, Copy)]
struct Modes {
    mutex: bool,
    kinds: &'static [Kind],
    downgrade: bool,
    handoff: bool,
    threads: bool,
}

impl Modes {
    fn of(mode: &str) -> Option<Modes> {
        let none = Modes {
            mutex: false,
            kinds: &[],
            downgrade: false,
            handoff: false,
            threads: false,
        };
        Some(match mode {
            "mutex" => Modes {
                mutex: true,
                ..none
            },
            "read" => Modes {
                kinds: &[Kind::Read],
                ..none
            },
            "write" => Modes {
                kinds: &[Kind::Write],
                ..none
            },
            "semaphore" => Modes {
                kinds: &[Kind::Semaphore],
                ..none
            },
            "downgrade" => Modes {
                downgrade: true,
                ..none
            },
            "handoff" => Modes {
                handoff: true,
                ..none
            },
            "threads" => Modes {
                threads: true,
                ..none
            },
            "all" => Modes {
                mutex: true,
                kinds: &[Kind::Read, Kind::Write, Kind::Semaphore],
                downgrade: true,
                handoff: true,
                threads: true,
            },
            _ => return None,
        })
    }
}

/// Entry point of `redlock-mux bench`.
pub fn main(argv: Vec<std::ffi::OsString>) -> Result<i32, Fail> {
    let Some(opts) = Options::parse(argv)? else {
        return crate::print_text(HELP);
    };
    if opts.tls {
        return run_tls(&opts);
    }
    if opts.sentinel {
        let progress = Progress::new(io::stderr().is_terminal());
        let n = opts.instances.unwrap_or(3);
        return sentinel::run(n, opts.iters, opts.json, &progress);
    }
    // Declared before the figures so the servers outlive every client using them.
    let servers;
    let (urls, origin) = match opts.given_nodes()? {
        Some((urls, from)) => {
            opts.check_given(&urls)?;
            let origin = match from {
                NodesFrom::Option => format!("{} nodes from --nodes", urls.len()),
                NodesFrom::Environment => format!("{} nodes from REDLOCK_NODES", urls.len()),
            };
            (urls, origin)
        }
        None => {
            let started = opts.start_servers()?;
            servers = started.0;
            (servers.urls(), started.1)
        }
    };

    let progress = Progress::new(io::stderr().is_terminal());
    let mut report = measure(&opts, &urls, origin, &progress)?;
    progress.clear();

    let mut out = io::stdout().lock();
    if opts.json {
        writeln!(out, "{}", report.json())?;
    } else {
        report.print(&mut out)?;
    }
    out.flush()?;
    Ok(0)
}

impl Options {
    /// The options, or `None` for `--help`.
    fn parse(argv: Vec<std::ffi::OsString>) -> Result<Option<Options>, Fail> {
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
        let mut sentinel = false;
        while let Some(arg) = parser.next()? {
            match arg {
                Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
                Long("server") => server = Some(parser.value()?.into()),
                Long("tls") => tls = true,
                Long("sentinel") => sentinel = true,
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
                Short('h') | Long("help") => return Ok(None),
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
        let Some(modes) = Modes::of(&mode) else {
            return Err(usage!("--mode: unknown mode {mode:?}").into());
        };
        if nodes.is_some() && instances.is_some() {
            return Err(usage!("give either --nodes or --instances, not both").into());
        }
        if server.is_some() && nodes.is_some() {
            return Err(
                usage!("--server picks the binary --instances starts: not with --nodes").into(),
            );
        }
        if tls && nodes.is_some() {
            return Err(
                usage!("--tls starts its own servers: give --instances, not --nodes").into(),
            );
        }
        if sentinel && (nodes.is_some() || server.is_some() || tls) {
            return Err(usage!(
                "--sentinel starts its own servers of the default binary: give --instances, not \
                 --nodes, --server or --tls"
            )
            .into());
        }
        if instances.unwrap_or(5) > redlock_mux::MAX_NODES {
            return Err(usage!("--instances: at most {}", redlock_mux::MAX_NODES).into());
        }
        Ok(Some(Options {
            nodes,
            instances,
            server,
            tls,
            sentinel,
            iters,
            mode,
            modes,
            threads: thread_counts.unwrap_or_else(|| THREADS.to_vec()),
            cell,
            rounds,
            json,
        }))
    }

    /// The nodes given by `--nodes` or `REDLOCK_NODES`, unless servers are to be started.
    fn given_nodes(&self) -> Result<Option<(Vec<String>, NodesFrom)>, Fail> {
        if self.instances.is_some() || self.server.is_some() {
            return Ok(None);
        }
        Ok(args::nodes_or_none(self.nodes.clone())?)
    }

    /// Reads given node URLs with the library's parser, for a usage error before anything
    /// runs, and refuses those the asked modes cannot measure.
    fn check_given(&self, urls: &[String]) -> Result<(), Fail> {
        let m = self.modes;
        for url in urls {
            let url = NodeUrl::parse(url).map_err(|e| usage!("{e}"))?;
            // The probes and baselines of the other modes address one server per URL; the
            // threads mode probes every master of a cluster and leaves rawN out.
            if url.is_cluster() && !m.threads {
                return Err(usage!(
                    "{url}: bench measures a Redis Cluster in --mode threads only (its other \
                     modes address one server per node)"
                )
                .into());
            }
            let plain_tcp = !url.is_tls() && url.unix_path().is_none();
            if !plain_tcp && (m.mutex || !m.kinds.is_empty() || m.threads) {
                return Err(usage!(
                    "{url}: the baselines speak plaintext TCP; give redis:// nodes for \
                     --mode {} (bench --tls measures TLS against plaintext)",
                    self.mode
                )
                .into());
            }
        }
        Ok(())
    }

    /// Starts `--instances` local servers: them, and what the report calls them.
    fn start_servers(&self) -> Result<(RedisCluster, String), Fail> {
        let n = self.instances.unwrap_or(5);
        let program = self
            .server
            .as_ref()
            .map_or_else(|| "redis-server".to_owned(), |p| p.display().to_string());
        if !self.json {
            eprintln!("starting {n} local servers ({program})...");
        }
        let programs = vec![self.server.as_deref(); n];
        let servers = RedisCluster::start_programs(&programs)
            .map_err(|e| Fail::other(format!("could not start {program}: {e}")))?;
        let origin = format!("{n} local {} instances", server_name(&servers.urls()[0]));
        if !self.json {
            eprintln!("started {origin}");
        }
        Ok((servers, origin))
    }
}

/// `bench --tls`: TLS next to plaintext on servers it starts.
fn run_tls(opts: &Options) -> Result<i32, Fail> {
    let n = opts.instances.unwrap_or(5);
    let progress = Progress::new(io::stderr().is_terminal());
    #[cfg(feature = "tls")]
    return tls::run(opts.server.as_deref(), n, opts.iters, opts.json, &progress);
    #[cfg(not(feature = "tls"))]
    {
        let _ = (n, progress);
        Err(usage!("--tls: this redlock-mux was built without TLS (the `tls` feature)").into())
    }
}

/// Runs every measurement the mode asks for on `urls`.
fn measure(
    opts: &Options,
    urls: &[String],
    origin: String,
    progress: &Progress,
) -> Result<Report, Fail> {
    let m = opts.modes;
    let mut report = Report {
        origin,
        iters: opts.iters,
        ..Report::default()
    };
    for n in sizes(urls.len()) {
        let nodes = &urls[..n];
        if m.mutex {
            report
                .mutex
                .push(mutex::bench_mutex(nodes, opts.iters, progress)?);
        }
        // Read-write locks at the largest N only (5 by default); the semaphore at every N.
        let kinds: Vec<Kind> = m
            .kinds
            .iter()
            .copied()
            .filter(|k| k.side().is_none() || n == urls.len())
            .collect();
        if !kinds.is_empty() {
            report
                .rw
                .push(kinds::bench_rw(nodes, opts.iters, &kinds, progress)?);
        }
        if m.downgrade {
            report
                .downgrade
                .push(downgrade::bench_downgrade(nodes, opts.iters, progress)?);
        }
    }
    if m.handoff {
        for fair in [false, true] {
            for threads in handoff::HANDOFF_THREADS {
                report
                    .handoff
                    .push(handoff::bench_handoff(urls, threads, fair, progress)?);
            }
        }
    }
    if m.threads {
        let plan = threads::ScalePlan {
            cell: opts.cell,
            rounds: opts.rounds,
            counts: opts.threads.clone(),
        };
        report.threads = threads::bench_threads(urls, &plan, progress)?;
        report.scale = Some(plan);
    }
    Ok(report)
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
    mutex: Vec<mutex::MutexResult>,
    rw: Vec<kinds::RwResult>,
    downgrade: Vec<downgrade::DowngradeResult>,
    handoff: Vec<handoff::HandoffResult>,
    threads: Vec<threads::ThreadsResult>,
    /// How the threads mode ran, if it did.
    scale: Option<threads::ScalePlan>,
}

impl Report {
    fn print(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let (origin, iters) = (&self.origin, self.iters);
        if !self.mutex.is_empty() {
            mutex::print_mutex(out, origin, iters, &mut self.mutex)?;
        }
        if !self.rw.is_empty() {
            kinds::print_rw(out, origin, iters, &mut self.rw)?;
        }
        if !self.downgrade.is_empty() {
            downgrade::print_downgrade(out, origin, iters, &mut self.downgrade)?;
        }
        if !self.handoff.is_empty() {
            handoff::print_handoff(out, origin, &mut self.handoff)?;
        }
        if let Some(plan) = &self.scale {
            threads::print_threads(out, origin, plan, &mut self.threads)?;
        }
        Ok(())
    }

    /// Every figure, as one JSON object.
    fn json(&mut self) -> serde_json::Value {
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "nodes": self.origin,
            "iters": self.iters,
            "block": BLOCK,
            "ttl_ms": TTL.as_millis() as u64,
            "mutex": mutex::json(&mut self.mutex),
            "rw": kinds::json(&mut self.rw),
            "downgrade": downgrade::json(&mut self.downgrade),
            "handoff": handoff::json(&mut self.handoff),
            "threads": threads::json(&mut self.threads),
            "scale": self.scale.as_ref().map(|plan| threads::plan_json(plan, &self.threads)),
        })
    }
}

/// The N measured: 1, 3 and 5 where there are that many nodes, and all the nodes.
fn sizes(nodes: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [1, 3, 5].into_iter().filter(|&n| n <= nodes).collect();
    if !sizes.contains(&nodes) {
        sizes.push(nodes);
    }
    sizes
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
