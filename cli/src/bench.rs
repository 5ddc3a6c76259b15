//! `redlock-mux bench`: lock latency against local or given Redis nodes, next to a
//! baseline measured in the same run.
//!
//! - `mutex`: the mutex next to a hand-written baseline, the least a Redlock client can do on
//!   the wire: `SET key token NX PX ttl` written to all N blocking sockets, then all N replies
//!   read; release by a compare-and-delete script sent the same way.
//! - `read`, `write`: read and write locks next to the library's own mutex.
//! - `handoff`: threads contending for one lock, each holding it for 1 ms; the figure is the
//!   gap from one thread's release to another's acquire.
//!
//! Whatever is compared runs in alternating blocks, so a change in machine load during the
//! run hits both alike; their ratio is the figure to watch.
#![forbid(unsafe_code)]

use std::io::{self, IsTerminal};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::resp::{self, Reply, Value};
use redlock_mux::{Client, Error};

use crate::args::{self, usage};
use crate::local_servers::RedisCluster;
use crate::node::NodeConn;
use crate::stats::{fmt_duration, ratio, Samples, Summary};
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux bench [--nodes URLS | --instances N] [--iters N]
                         [--mode mutex|read|write|handoff|all] [--json]

Measures lock latency: acquire, release and the whole cycle (p50, p90, p99,
p99.9, max), ops/s and a histogram.

Modes:
  mutex     (default) the mutex next to a hand-written baseline (SET NX PX to
            all N sockets, then all N replies; release by compare-and-delete),
            in alternating blocks, at N = 1, 3 and 5
  read      read locks next to the mutex, in alternating blocks, at the same N
  write     write locks next to the mutex, likewise
  handoff   contended hand-off at the largest N: 2, then 8 threads loop lock,
            hold 1 ms, release for 3 s each; the figure is the gap from one
            thread starting its release to another's lock returning. Measured
            with plain and with fair (FIFO) clients
  all       every mode above

Without --nodes, starts N local redis-server processes (default 5) on free
loopback ports, with temporary directories and no persistence, and stops them
on exit. N = 1, 3 and 5 are measured (those not above the number of nodes, and
the number of nodes itself), on the first N nodes.

Options:
  --nodes URLS      comma-separated redis:// URLs of nodes to use instead
                    (REDLOCK_NODES is not read: without --nodes, local
                    servers are started)
  --instances N     local servers to start (default 5)
  --iters N         measured cycles per lock kind per N (default 20000)
  --mode MODE       mutex, read, write, handoff or all (see above)
  --json            print the figures as JSON on stdout
  -h, --help        this text
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
/// Contending threads in the hand-off runs.
const HANDOFF_THREADS: [usize; 2] = [2, 8];
/// The issue's hand-off targets: p50 and p99 of the gap.
const HANDOFF_TARGET: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(5));
/// The read-write issue's target: read and write within this factor of the mutex.
const RW_TARGET: f64 = 1.1;

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
    let (mut nodes, mut instances, mut mode) = (None, None, String::from("mutex"));
    let mut iters = 20_000;
    let mut json = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("instances") => instances = Some(args::count("--instances", parser.value()?)?),
            Long("iters") => iters = args::count("--iters", parser.value()?)?,
            Long("mode") => mode = args::text("--mode", parser.value()?)?,
            Long("json") => json = true,
            Short('h') | Long("help") => return crate::print_text(HELP),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let (mutex, rw_kinds, handoff): (bool, &[Kind], bool) = match mode.as_str() {
        "mutex" => (true, &[], false),
        "read" => (false, &[Kind::Read], false),
        "write" => (false, &[Kind::Write], false),
        "handoff" => (false, &[], true),
        "all" => (true, &[Kind::Read, Kind::Write], true),
        other => return Err(usage!("--mode: unknown mode {other:?}").into()),
    };
    if nodes.is_some() && instances.is_some() {
        return Err(usage!("give either --nodes or --instances, not both").into());
    }

    // Declared before the figures so the servers outlive every client using them.
    let cluster;
    let (urls, origin) = if nodes.is_some() {
        let urls = args::nodes(nodes)?;
        let origin = format!("{} given nodes", urls.len());
        (urls, origin)
    } else {
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
    };

    let sizes = sizes(urls.len());
    let progress = Progress::new(!json && io::stderr().is_terminal());
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
        if !rw_kinds.is_empty() {
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
    progress.clear();

    if json {
        println!("{}", report.json());
    } else {
        report.print();
    }
    Ok(0)
}

/// Everything one run measured.
#[derive(Default)]
struct Report {
    origin: String,
    iters: usize,
    mutex: Vec<MutexResult>,
    rw: Vec<RwResult>,
    handoff: Vec<HandoffResult>,
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
}

fn bench_mutex(urls: &[String], iters: usize, progress: &Progress) -> Result<MutexResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let mut base = Baseline::connect(urls)
        .map_err(|e| Fail::other(format!("baseline could not connect: {e}")))?;
    let ours_key = format!("redlock-mux:bench:ours:{n}");
    let base_key = format!("redlock-mux:bench:baseline:{n}");

    let mut ours = Phases::with_capacity(iters);
    let mut baseline = Phases::with_capacity(iters);
    let mut scratch = Phases::default();
    // Warm-up: connections open, scripts load, caches and branch predictors settle.
    let warmup = (iters / 10).clamp(100, 2000);
    ours_cycles(&client, Kind::Mutex, &ours_key, warmup, &mut scratch);
    base_cycles(&mut base, &base_key, warmup, &mut scratch)?;

    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Alternate which client goes first, so neither always follows the other.
        if block % 2 == 0 {
            ours_cycles(&client, Kind::Mutex, &ours_key, count, &mut ours);
            base_cycles(&mut base, &base_key, count, &mut baseline)?;
        } else {
            base_cycles(&mut base, &base_key, count, &mut baseline)?;
            ours_cycles(&client, Kind::Mutex, &ours_key, count, &mut ours);
        }
        done += count;
        block += 1;
        progress.show(&format!("mutex N={n}"), done, iters);
    }
    Ok(MutexResult { n, ours, baseline })
}

/// Read and/or write lock figures at one N, next to the mutex measured in the same run.
struct RwResult {
    n: usize,
    /// The mutex first, then each kind measured.
    kinds: Vec<(Kind, Phases)>,
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
    let mut measured: Vec<(Kind, Phases)> = std::iter::once(Kind::Mutex)
        .chain(kinds.iter().copied())
        .map(|k| (k, Phases::with_capacity(iters)))
        .collect();
    // One key per kind: a read and a write lock on one key share keys on the nodes.
    let key = |k: Kind| format!("redlock-mux:bench:rw:{}:{n}", k.name());
    let mut scratch = Phases::default();
    let warmup = (iters / 10).clamp(100, 2000);
    for (kind, _) in &measured {
        ours_cycles(&client, *kind, &key(*kind), warmup, &mut scratch);
    }
    let label = format!(
        "{} N={n}",
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join("+")
    );
    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Rotate which kind goes first, so none always follows another.
        let len = measured.len();
        for i in 0..len {
            let (kind, into) = &mut measured[(block + i) % len];
            ours_cycles(&client, *kind, &key(*kind), count, into);
        }
        done += count;
        block += 1;
        progress.show(&label, done, iters);
    }
    Ok(RwResult { n, kinds: measured })
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
    base: &mut Baseline,
    key: &str,
    count: usize,
    into: &mut Phases,
) -> Result<(), Fail> {
    for _ in 0..count {
        let start = Instant::now();
        let token = token();
        let won = base
            .acquire(key.as_bytes(), &token)
            .map_err(|e| Fail::other(format!("baseline acquire: {e}")))?;
        let acquired = Instant::now();
        base.release(key.as_bytes(), &token)
            .map_err(|e| Fail::other(format!("baseline release: {e}")))?;
        let released = Instant::now();
        if won {
            into.record(start, acquired, released);
        } else {
            into.errors += 1;
        }
    }
    Ok(())
}

/// A fresh 160-bit token as 40 hex characters, drawn like the library draws its own.
fn token() -> [u8; 40] {
    let mut raw = [0u8; 20];
    getrandom::fill(&mut raw).expect("the OS random source failed");
    let mut hex = [0u8; 40];
    for (i, b) in raw.iter().enumerate() {
        hex[2 * i] = b"0123456789abcdef"[(b >> 4) as usize];
        hex[2 * i + 1] = b"0123456789abcdef"[(b & 15) as usize];
    }
    hex
}

/// Compare-and-delete with the same release announcement the library's script makes, so
/// both sides ask the server for the same work.
const BASELINE_RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";

/// The hand-written baseline: one blocking socket per node, no timeouts beyond the socket's.
struct Baseline {
    conns: Vec<NodeConn>,
    sha: Vec<u8>,
    out: Vec<u8>,
}

impl Baseline {
    fn connect(urls: &[String]) -> io::Result<Baseline> {
        let mut conns = Vec::with_capacity(urls.len());
        let mut sha = Vec::new();
        for url in urls {
            let url = redlock_mux::NodeUrl::parse(url).map_err(io::Error::other)?;
            let mut conn = NodeConn::connect(&url, Duration::from_secs(5))
                .map_err(|e| io::Error::other(e.to_string()))?;
            match conn
                .call_ok(&[b"SCRIPT", b"LOAD", BASELINE_RELEASE.as_bytes()])
                .map_err(|e| io::Error::other(e.to_string()))?
            {
                Value::Bulk(Some(digest)) => sha = digest,
                other => return Err(io::Error::other(format!("SCRIPT LOAD answered {other:?}"))),
            }
            conns.push(conn);
        }
        Ok(Baseline {
            conns,
            sha,
            out: Vec::with_capacity(256),
        })
    }

    /// `SET key token NX PX ttl` to all, then every reply; whether a majority said OK.
    fn acquire(&mut self, key: &[u8], token: &[u8]) -> io::Result<bool> {
        let ttl = TTL.as_millis().to_string();
        self.out.clear();
        resp::encode_command(
            &mut self.out,
            &[b"SET", key, token, b"NX", b"PX", ttl.as_bytes()],
        );
        self.fan_out(|r| matches!(r, Reply::Simple(b"OK")))
    }

    /// Compare-and-delete to all, then every reply.
    fn release(&mut self, key: &[u8], token: &[u8]) -> io::Result<bool> {
        let mut channel = b"redlock-mux:wake:".to_vec();
        channel.extend_from_slice(key);
        self.out.clear();
        resp::encode_command(
            &mut self.out,
            &[b"EVALSHA", &self.sha, b"1", key, token, &channel],
        );
        self.fan_out(|r| matches!(r, Reply::Integer(_)))
    }

    fn fan_out(&mut self, yes: impl Fn(&Reply<'_>) -> bool) -> io::Result<bool> {
        for c in &mut self.conns {
            c.send(&self.out)?;
        }
        let mut votes = 0;
        for c in &mut self.conns {
            if c.read_with(&yes)? {
                votes += 1;
            }
        }
        Ok(votes > self.conns.len() / 2)
    }
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

/// A one-line progress bar on stderr, only when stderr is a terminal.
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
        eprint!(
            "\r{label:<14} [{}{}] {done}/{total}   ",
            "#".repeat(filled),
            ".".repeat(WIDTH - filled)
        );
    }

    fn clear(&self) {
        if self.enabled {
            eprint!("\r{:70}\r", "");
        }
    }
}

impl Report {
    fn print(&mut self) {
        let (origin, iters) = (&self.origin, self.iters);
        if !self.mutex.is_empty() {
            print_mutex(origin, iters, &mut self.mutex);
        }
        if !self.rw.is_empty() {
            print_rw(origin, iters, &mut self.rw);
        }
        if !self.handoff.is_empty() {
            print_handoff(origin, &mut self.handoff);
        }
    }

    fn json(&mut self) -> String {
        let mutex: Vec<String> = self
            .mutex
            .iter_mut()
            .map(|r| {
                let p50 = phase_ratios(0.5, &mut r.ours, &mut r.baseline);
                let p99 = phase_ratios(0.99, &mut r.ours, &mut r.baseline);
                format!(
                    "{{\"n\":{},\"ours\":{},\"baseline\":{},\"ratio_p50\":{},\"ratio_p99\":{}}}",
                    r.n,
                    phases_json(&mut r.ours),
                    phases_json(&mut r.baseline),
                    p50,
                    p99
                )
            })
            .collect();
        let rw: Vec<String> = self
            .rw
            .iter_mut()
            .map(|r| {
                let (first, rest) = r.kinds.split_at_mut(1);
                let base = &mut first[0].1;
                let mut fields = vec![format!("\"n\":{}", r.n)];
                for (kind, phases) in rest.iter_mut() {
                    let p50 = phase_ratios(0.5, phases, base);
                    let p99 = phase_ratios(0.99, phases, base);
                    fields.push(format!(
                        "\"{}\":{{\"figures\":{},\"ratio_to_mutex_p50\":{},\"ratio_to_mutex_p99\":{}}}",
                        kind.name(),
                        phases_json(phases),
                        p50,
                        p99
                    ));
                }
                fields.push(format!("\"mutex\":{}", phases_json(base)));
                format!("{{{}}}", fields.join(","))
            })
            .collect();
        let handoff: Vec<String> = self
            .handoff
            .iter_mut()
            .map(|h| {
                format!(
                    "{{\"n\":{},\"threads\":{},\"fair\":{},\"hold_ms\":{},\"gap\":{},\"regrants\":{},\"overlaps\":{},\"errors\":{}}}",
                    h.n,
                    h.threads,
                    h.fair,
                    HANDOFF_HOLD.as_millis(),
                    h.gaps.summary().to_json(),
                    h.regrants,
                    h.overlaps,
                    h.errors
                )
            })
            .collect();
        format!(
            "{{\"nodes\":{},\"iters\":{},\"block\":{},\"ttl_ms\":{},\"mutex\":[{}],\"rw\":[{}],\"handoff\":[{}]}}",
            json_string(&self.origin),
            self.iters,
            BLOCK,
            TTL.as_millis(),
            mutex.join(","),
            rw.join(","),
            handoff.join(",")
        )
    }
}

/// Ratios of `ours` to `base` at quantile `q`, per phase, as a JSON object.
fn phase_ratios(q: f64, ours: &mut Phases, base: &mut Phases) -> String {
    format!(
        "{{\"acquire\":{:.4},\"release\":{:.4},\"cycle\":{:.4}}}",
        ratio(ours.acquire.quantile(q), base.acquire.quantile(q)),
        ratio(ours.release.quantile(q), base.release.quantile(q)),
        ratio(ours.cycle.quantile(q), base.cycle.quantile(q)),
    )
}

/// Rows of p50 and p99 for `ours` next to `base`, with their ratios, one per phase.
fn print_ratio_rows(n: usize, ours: &mut Phases, base: &mut Phases) {
    for (name, o, b) in [
        ("acquire", &mut ours.acquire, &mut base.acquire),
        ("release", &mut ours.release, &mut base.release),
        ("cycle", &mut ours.cycle, &mut base.cycle),
    ] {
        let (o, b) = (o.summary(), b.summary());
        println!(
            "{:>2}  {:<8} {:>10} {:>10} {:>6.3}x   {:>10} {:>10} {:>6.3}x",
            n,
            name,
            fmt_duration(o.p50),
            fmt_duration(b.p50),
            ratio(o.p50, b.p50),
            fmt_duration(o.p99),
            fmt_duration(b.p99),
            ratio(o.p99, b.p99),
        );
    }
}

/// The full figures of each measured client, one row per phase.
fn print_detail_rows(n: usize, who: &str, phases: &mut Phases) {
    let errors = phases.errors;
    for (name, s) in [
        ("acquire", &mut phases.acquire),
        ("release", &mut phases.release),
        ("cycle", &mut phases.cycle),
    ] {
        let sum = s.summary();
        let cycle = name == "cycle";
        println!(
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
        );
    }
}

fn print_detail_header(who: &str) {
    println!(
        "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "N", who, "op", "p50", "p90", "p99", "p99.9", "max", "ops/s", "errors"
    );
}

fn print_mutex(origin: &str, iters: usize, results: &mut [MutexResult]) {
    println!(
        "mutex, uncontended: {origin}; {iters} cycles per client per N, in alternating blocks of {BLOCK}"
    );
    println!("ours = redlock_mux::Client; baseline = SET NX PX to all N sockets, then all N replies; release = EVALSHA compare-and-delete");
    println!();
    println!(
        "{:>2}  {:<8} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
        "N", "op", "ours p50", "base p50", "ratio", "ours p99", "base p99", "ratio"
    );
    for r in results.iter_mut() {
        print_ratio_rows(r.n, &mut r.ours, &mut r.baseline);
    }
    println!();
    print_detail_header("client");
    for r in results.iter_mut() {
        print_detail_rows(r.n, "ours", &mut r.ours);
        print_detail_rows(r.n, "baseline", &mut r.baseline);
    }
    if let Some(last) = results.last() {
        println!();
        println!("cycle latency at N={}, ours:", last.n);
        print!("{}", last.ours.cycle.histogram().render(14, 40));
        println!("cycle latency at N={}, baseline:", last.n);
        print!("{}", last.baseline.cycle.histogram().render(14, 40));
    }
    println!();
    println!("targets (issue): acquire p50 <= baseline; cycle p50 <= 1.05 x baseline");
    for r in results.iter_mut() {
        let a = ratio(
            r.ours.acquire.quantile(0.5),
            r.baseline.acquire.quantile(0.5),
        );
        let c = ratio(r.ours.cycle.quantile(0.5), r.baseline.cycle.quantile(0.5));
        println!(
            "  N={}: acquire p50 {:.3}x [{}], cycle p50 {:.3}x [{}]",
            r.n,
            a,
            met(a <= 1.0),
            c,
            met(c <= 1.05),
        );
    }
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "missed"
    }
}

fn print_rw(origin: &str, iters: usize, results: &mut [RwResult]) {
    println!();
    println!(
        "read-write locks, uncontended, next to the mutex: {origin}; {iters} cycles per kind per N, in rotating blocks of {BLOCK}"
    );
    println!(
        "each cycle: try_read_lock / try_write_lock / try_lock, then release; ratio = kind / mutex"
    );
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for (kind, phases) in rest.iter_mut() {
            println!();
            println!(
                "{:>2}  {:<8} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
                "N",
                "op",
                format!("{} p50", kind.name()),
                "mutex p50",
                "ratio",
                format!("{} p99", kind.name()),
                "mutex p99",
                "ratio"
            );
            print_ratio_rows(r.n, phases, mutex);
        }
    }
    println!();
    print_detail_header("kind");
    for r in results.iter_mut() {
        for (kind, phases) in r.kinds.iter_mut() {
            print_detail_rows(r.n, kind.name(), phases);
        }
    }
    println!();
    println!(
        "target (read-write issue): acquire and cycle p50 within {RW_TARGET}x of the mutex at N=5"
    );
    for r in results.iter_mut() {
        let (first, rest) = r.kinds.split_at_mut(1);
        let mutex = &mut first[0].1;
        for (kind, phases) in rest.iter_mut() {
            let a = ratio(phases.acquire.quantile(0.5), mutex.acquire.quantile(0.5));
            let c = ratio(phases.cycle.quantile(0.5), mutex.cycle.quantile(0.5));
            println!(
                "  N={} {:<5}: acquire p50 {:.3}x [{}], cycle p50 {:.3}x [{}]",
                r.n,
                kind.name(),
                a,
                met(a <= RW_TARGET),
                c,
                met(c <= RW_TARGET),
            );
        }
    }
}

fn print_handoff(origin: &str, results: &mut [HandoffResult]) {
    println!();
    println!(
        "contended hand-off: {origin}; each thread loops lock -> hold {} -> release for {}",
        fmt_duration(HANDOFF_HOLD),
        fmt_duration(HANDOFF_RUN)
    );
    println!(
        "gap = another thread's lock returning - the holder starting its release (first {} not counted)",
        fmt_duration(HANDOFF_WARMUP)
    );
    println!(
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
    );
    for h in results.iter_mut() {
        let s = h.gaps.summary();
        println!(
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
        );
    }
    let (p50_target, p99_target) = HANDOFF_TARGET;
    println!();
    println!(
        "targets (issue): gap p50 < {}, p99 < {}",
        fmt_duration(p50_target),
        fmt_duration(p99_target)
    );
    for h in results.iter_mut() {
        let (p50, p99) = (h.gaps.quantile(0.5), h.gaps.quantile(0.99));
        println!(
            "  N={} {:<5} x{}: p50 {} [{}], p99 {} [{}]",
            h.n,
            if h.fair { "fair" } else { "plain" },
            h.threads,
            fmt_duration(p50),
            met(!h.gaps.is_empty() && p50 < p50_target),
            fmt_duration(p99),
            met(!h.gaps.is_empty() && p99 < p99_target),
        );
    }
}

fn phases_json(p: &mut Phases) -> String {
    let cycle: Summary = p.cycle.summary();
    format!(
        "{{\"acquire\":{},\"release\":{},\"cycle\":{},\"ops_per_sec\":{:.1},\"errors\":{}}}",
        p.acquire.summary().to_json(),
        p.release.summary().to_json(),
        cycle.to_json(),
        cycle.ops_per_sec(),
        p.errors
    )
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
