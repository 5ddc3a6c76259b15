//! `redlock-mux bench`: lock latency against local or given Redis nodes, next to a
//! hand-written baseline measured in the same run.
//!
//! The baseline is the least a Redlock client can do on the wire: `SET key token NX PX ttl`
//! written to all N blocking sockets, then all N replies read; release by a compare-and-delete
//! script sent the same way. Ours and the baseline run in alternating blocks, so a change in
//! machine load during the run hits both alike; their ratio is the figure to watch.
#![forbid(unsafe_code)]

use std::io::{self, IsTerminal};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::resp::{self, Reply, Value};
use redlock_mux::{Client, Error};

use crate::args::{self, usage, Spec};
use crate::local_servers::RedisCluster;
use crate::node::NodeConn;
use crate::stats::{fmt_duration, ratio, Samples, Summary};
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux bench [--nodes URLS | --instances N] [--iters N]
                         [--mode mutex|read|write|handoff|all] [--json]

Measures lock latency: acquire, release and the whole cycle (p50, p90, p99,
p99.9, max), ops/s and a histogram, next to a hand-written baseline (SET NX PX
to all N sockets, then all N replies; release by compare-and-delete) measured
in the same run, in alternating blocks.

Without --nodes, starts N local redis-server processes (default 5) on free
loopback ports, with temporary directories and no persistence, and stops them
on exit. The mutex is measured at N = 1, 3 and 5 (those not above the number
of nodes, and the number of nodes itself), on the first N nodes.

Options:
  --nodes URLS      comma-separated redis:// URLs of nodes to use instead
                    (REDLOCK_NODES is not read: without --nodes, local
                    servers are started)
  --instances N     local servers to start (default 5)
  --iters N         measured cycles per client per N (default 20000)
  --mode MODE       mutex (default), handoff (release-to-acquire latency between
                    two threads), read, write, or all
  --json            print the figures as JSON on stdout
  -h, --help        this text
";

/// Cycles between switches from one client to the other.
const BLOCK: usize = 250;
/// TTL of benchmark locks: long enough never to expire during a cycle.
const TTL: Duration = Duration::from_secs(10);
/// How long the holder keeps the lock in a handoff, so the waiter is surely waiting.
const HANDOFF_HOLD: Duration = Duration::from_millis(2);

/// Entry point of `redlock-mux bench`.
pub fn main(argv: &[String]) -> Result<i32, Fail> {
    let spec = Spec {
        options: &["nodes", "instances", "iters", "mode"],
        switches: &["json"],
        takes_command: false,
    };
    let Some(parsed) = args::parse_command(&spec, argv, HELP)? else {
        return Ok(0);
    };
    if let Some(extra) = parsed.positional.first() {
        return Err(usage!("unexpected argument {extra:?}").into());
    }
    let iters = parsed.count("iters", 20_000)?;
    let mode = parsed.value("mode").unwrap_or("mutex");
    let (mutex, handoff) = match mode {
        "mutex" => (true, false),
        "handoff" => (false, true),
        "all" => (true, true),
        "read" | "write" => return Err(crate::not_supported_yet("read-write locks")),
        other => return Err(usage!("--mode: unknown mode {other:?}").into()),
    };
    let json = parsed.switch("json");
    if parsed.value("nodes").is_some() && parsed.value("instances").is_some() {
        return Err(usage!("give either --nodes or --instances, not both").into());
    }

    // Declared before the figures so the servers outlive every client using them.
    let cluster;
    let (urls, origin) = if parsed.value("nodes").is_some() {
        let urls = args::nodes(&parsed)?;
        let origin = format!("{} given nodes", urls.len());
        (urls, origin)
    } else {
        let n = parsed.count("instances", 5)?;
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
    let mut results = Vec::new();
    let mut handoffs = Vec::new();
    for &n in &sizes {
        let nodes = &urls[..n];
        if mutex {
            let r = bench_mutex(nodes, iters, &progress)?;
            results.push(r);
        }
        if handoff {
            let count = (iters / 100).clamp(20, 200);
            handoffs.push(bench_handoff(nodes, count, &progress)?);
        }
    }
    progress.clear();

    if json {
        println!("{}", to_json(&origin, iters, &results, &handoffs));
    } else {
        print_report(&origin, iters, &mut results, &mut handoffs);
    }
    Ok(0)
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
    ours_cycles(&client, &ours_key, warmup, &mut scratch);
    base_cycles(&mut base, &base_key, warmup, &mut scratch)?;

    let mut done = 0;
    let mut block = 0usize;
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Alternate which client goes first, so neither always follows the other.
        if block % 2 == 0 {
            ours_cycles(&client, &ours_key, count, &mut ours);
            base_cycles(&mut base, &base_key, count, &mut baseline)?;
        } else {
            base_cycles(&mut base, &base_key, count, &mut baseline)?;
            ours_cycles(&client, &ours_key, count, &mut ours);
        }
        done += count;
        block += 1;
        progress.show(&format!("mutex N={n}"), done, iters);
    }
    Ok(MutexResult { n, ours, baseline })
}

fn ours_cycles(client: &Client, key: &str, count: usize, into: &mut Phases) {
    for _ in 0..count {
        let start = Instant::now();
        match client.try_lock(key, TTL) {
            Ok(lock) => {
                let acquired = Instant::now();
                let ok = lock.release().is_ok();
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
            let mut conn = NodeConn::connect(url, Duration::from_secs(5))?;
            match conn.call_ok(&[b"SCRIPT", b"LOAD", BASELINE_RELEASE.as_bytes()])? {
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

/// Release-to-acquire latency between two threads at one N.
struct HandoffResult {
    n: usize,
    latency: Samples,
    errors: u64,
}

/// One thread holds the lock while another waits in [`Client::lock`]; the figure is the time
/// from the holder's release returning to the waiter's lock returning.
fn bench_handoff(
    urls: &[String],
    count: usize,
    progress: &Progress,
) -> Result<HandoffResult, Fail> {
    let n = urls.len();
    let client = Client::builder()
        .nodes(urls)
        .build()
        .map_err(|e| Fail::other(format!("bad nodes: {e}")))?;
    let key = format!("redlock-mux:bench:handoff:{n}");
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (got_tx, got_rx) = mpsc::channel::<Result<Instant, Error>>();
    let waiter = {
        let client = client.clone();
        let key = key.clone();
        thread::spawn(move || {
            while go_rx.recv().is_ok() {
                let r = client.lock(&key, TTL).and_then(|lock| {
                    let at = Instant::now();
                    lock.release().map(|()| at)
                });
                if got_tx.send(r).is_err() {
                    break;
                }
            }
        })
    };
    let mut result = HandoffResult {
        n,
        latency: Samples::with_capacity(count),
        errors: 0,
    };
    for i in 0..count {
        let holder = match client.lock(&key, TTL) {
            Ok(l) => l,
            Err(_) => {
                result.errors += 1;
                continue;
            }
        };
        go_tx
            .send(())
            .map_err(|_| Fail::other("handoff waiter stopped".into()))?;
        thread::sleep(HANDOFF_HOLD);
        let release = holder.release();
        let released = Instant::now();
        match (release, got_rx.recv_timeout(TTL * 2)) {
            (Ok(()), Ok(Ok(at))) => result.latency.push(at.saturating_duration_since(released)),
            (_, Err(_)) => return Err(Fail::other("handoff waiter did not answer".into())),
            _ => result.errors += 1,
        }
        progress.show(&format!("handoff N={n}"), i + 1, count);
    }
    drop(go_tx);
    let _ = waiter.join();
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

fn print_report(
    origin: &str,
    iters: usize,
    results: &mut [MutexResult],
    handoffs: &mut [HandoffResult],
) {
    if !results.is_empty() {
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
            for (name, ours, base) in [
                ("acquire", &mut r.ours.acquire, &mut r.baseline.acquire),
                ("release", &mut r.ours.release, &mut r.baseline.release),
                ("cycle", &mut r.ours.cycle, &mut r.baseline.cycle),
            ] {
                let (o, b) = (ours.summary(), base.summary());
                println!(
                    "{:>2}  {:<8} {:>10} {:>10} {:>6.3}x   {:>10} {:>10} {:>6.3}x",
                    r.n,
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
        println!();
        println!(
            "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
            "N", "client", "op", "p50", "p90", "p99", "p99.9", "max", "ops/s", "errors"
        );
        for r in results.iter_mut() {
            for (who, phases) in [("ours", &mut r.ours), ("baseline", &mut r.baseline)] {
                let errors = phases.errors;
                for (name, s) in [
                    ("acquire", &mut phases.acquire),
                    ("release", &mut phases.release),
                    ("cycle", &mut phases.cycle),
                ] {
                    let sum = s.summary();
                    let ops = if name == "cycle" {
                        format!("{:.0}", sum.ops_per_sec())
                    } else {
                        String::new()
                    };
                    println!(
                        "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
                        r.n,
                        who,
                        name,
                        fmt_duration(sum.p50),
                        fmt_duration(sum.p90),
                        fmt_duration(sum.p99),
                        fmt_duration(sum.p999),
                        fmt_duration(sum.max),
                        ops,
                        if name == "cycle" {
                            errors.to_string()
                        } else {
                            String::new()
                        },
                    );
                }
            }
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
                if a <= 1.0 { "met" } else { "missed" },
                c,
                if c <= 1.05 { "met" } else { "missed" },
            );
        }
    }
    if !handoffs.is_empty() {
        println!();
        println!("handoff: release returning in one thread -> lock returning in a waiting thread ({origin})");
        println!(
            "{:>2}  {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6}",
            "N", "p50", "p90", "p99", "p99.9", "max", "count", "errors"
        );
        for h in handoffs.iter_mut() {
            let s = h.latency.summary();
            println!(
                "{:>2}  {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6}",
                h.n,
                fmt_duration(s.p50),
                fmt_duration(s.p90),
                fmt_duration(s.p99),
                fmt_duration(s.p999),
                fmt_duration(s.max),
                s.count,
                h.errors
            );
        }
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

fn to_json(
    origin: &str,
    iters: usize,
    results: &[MutexResult],
    handoffs: &[HandoffResult],
) -> String {
    // Summaries sort samples in place; work on copies so the caller's data stays as it was.
    let mut mutex = Vec::new();
    for r in results {
        let mut ours = Phases {
            acquire: r.ours.acquire.clone(),
            release: r.ours.release.clone(),
            cycle: r.ours.cycle.clone(),
            errors: r.ours.errors,
        };
        let mut base = Phases {
            acquire: r.baseline.acquire.clone(),
            release: r.baseline.release.clone(),
            cycle: r.baseline.cycle.clone(),
            errors: r.baseline.errors,
        };
        let ratios = |q: f64, ours: &mut Phases, base: &mut Phases| {
            format!(
                "{{\"acquire\":{:.4},\"release\":{:.4},\"cycle\":{:.4}}}",
                ratio(ours.acquire.quantile(q), base.acquire.quantile(q)),
                ratio(ours.release.quantile(q), base.release.quantile(q)),
                ratio(ours.cycle.quantile(q), base.cycle.quantile(q)),
            )
        };
        let p50 = ratios(0.5, &mut ours, &mut base);
        let p99 = ratios(0.99, &mut ours, &mut base);
        mutex.push(format!(
            "{{\"n\":{},\"ours\":{},\"baseline\":{},\"ratio_p50\":{},\"ratio_p99\":{}}}",
            r.n,
            phases_json(&mut ours),
            phases_json(&mut base),
            p50,
            p99
        ));
    }
    let handoff: Vec<String> = handoffs
        .iter()
        .map(|h| {
            let mut s = h.latency.clone();
            format!(
                "{{\"n\":{},\"latency\":{},\"errors\":{}}}",
                h.n,
                s.summary().to_json(),
                h.errors
            )
        })
        .collect();
    format!(
        "{{\"nodes\":{},\"iters\":{},\"block\":{},\"ttl_ms\":{},\"mutex\":[{}],\"handoff\":[{}]}}",
        json_string(origin),
        iters,
        BLOCK,
        TTL.as_millis(),
        mutex.join(","),
        handoff.join(",")
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
