//! Lock latency of redlock-mux next to a raw baseline and the published Redlock crates, in one
//! run, against local `redis-server` processes this program starts.
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml -- [--quick]
//! ```
//!
//! Workloads (all with a 10 s TTL, keys distinct per implementation):
//! - uncontended acquire, release and acquire+release, at N = 1, 3 and 5;
//! - hand-off at N = 5: two clients take turns on one key, each holding it 1 ms; the figure is
//!   the gap from the start of one client's release to the other's acquire returning;
//! - scale at N = 5 (`scale.rs`): T = 1, 4, 16, 64 threads or tasks on distinct keys, timed
//!   cells: ops/s, acquire and cycle latency, failed calls, connections per node and server CPU
//!   per cycle, for redlock-mux (one shared client), rawN, rawQ (T = 1), and rslock (one shared
//!   `LockManager`, from OS threads and from tokio tasks).
//! - read and write locks, uncontended, at N = 5: redlock-mux next to `rawQ-rw`
//!   ([`raw::RawQRw`]), the ideal client of the read-write lock design's scripts (none of the
//!   published crates has read-write locks).
//!
//! Implementations run in alternating blocks (the order rotating each round), so drift in the
//! machine's load spreads over all of them. Each client is warmed up before it is measured.

mod lockers;
mod scale;

use redlock_mux_kit::{local_servers, raw, stats};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use local_servers::RedisCluster;
use lockers::{Kind, Locker};
use stats::{fmt_duration, ratio, Samples};

/// How much to measure.
struct Plan {
    /// Rounds of uncontended blocks; each round runs one block per implementation.
    rounds: usize,
    /// Most iterations in one uncontended block.
    block_iters: usize,
    /// Longest time of one uncontended block.
    block_time: Duration,
    /// Rounds of hand-off blocks.
    handoff_rounds: usize,
    /// Hand-offs per block for ours and the baseline.
    handoff_fast: usize,
    /// Hand-offs per block for the peers, which sleep between retries.
    handoff_slow: usize,
    /// Longest time of one hand-off block.
    handoff_time: Duration,
    /// Rounds of scale cells.
    scale_rounds: usize,
    /// Length of one scale cell.
    scale_cell: Duration,
}

const FULL: Plan = Plan {
    rounds: 12,
    block_iters: 250,
    block_time: Duration::from_millis(80),
    handoff_rounds: 5,
    handoff_fast: 100,
    handoff_slow: 8,
    handoff_time: Duration::from_millis(2500),
    scale_rounds: 3,
    scale_cell: Duration::from_secs(3),
};

const QUICK: Plan = Plan {
    rounds: 4,
    block_iters: 150,
    block_time: Duration::from_millis(40),
    handoff_rounds: 2,
    handoff_fast: 50,
    handoff_slow: 4,
    handoff_time: Duration::from_millis(1200),
    scale_rounds: 1,
    scale_cell: Duration::from_secs(1),
};

/// The hold time of the hand-off workload.
const HOLD: Duration = Duration::from_millis(1);
/// Node counts of the uncontended workloads.
const NODES: [usize; 3] = [1, 3, 5];

/// One table cell's data.
enum Cell {
    Latency(Samples),
}

struct Row {
    name: String,
    cells: Vec<Option<Cell>>,
    failures: Vec<usize>,
}

impl Row {
    fn new(name: String) -> Row {
        Row {
            name,
            cells: Kind::ALL.iter().map(|_| None).collect(),
            failures: vec![0; Kind::ALL.len()],
        }
    }

    fn samples(&mut self, kind: Kind) -> &mut Samples {
        let cell = self.cells[index(kind)].get_or_insert_with(|| Cell::Latency(Samples::default()));
        let Cell::Latency(s) = cell;
        s
    }
}

fn index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

/// `Kind::ALL`, rotated by `round` so no implementation always goes first.
fn order(round: usize) -> impl Iterator<Item = Kind> {
    let n = Kind::ALL.len();
    (0..n).map(move |i| Kind::ALL[(i + round) % n])
}

fn key(kind: Kind, what: &str) -> String {
    format!("bench:{}:{what}", kind.name())
}

/// Acquire+release `count` times, unmeasured.
fn warm_up(locker: &mut Locker, key: &str, count: usize) {
    for _ in 0..count {
        if let Some(g) = locker.try_acquire(key) {
            let _ = locker.release(key, g);
        }
    }
}

/// One uncontended block: acquire, release, and both, timed separately in one loop.
fn uncontended_block(locker: &mut Locker, key: &str, plan: &Plan, rows: &mut [Row], kind: Kind) {
    let end = Instant::now() + plan.block_time;
    for _ in 0..plan.block_iters {
        if Instant::now() >= end {
            break;
        }
        let t0 = Instant::now();
        let Some(g) = locker.try_acquire(key) else {
            rows[0].failures[index(kind)] += 1;
            continue;
        };
        let t1 = Instant::now();
        let released = locker.release(key, g);
        let t2 = Instant::now();
        if !released {
            rows[1].failures[index(kind)] += 1;
            continue;
        }
        rows[0].samples(kind).push(t1 - t0);
        rows[1].samples(kind).push(t2 - t1);
        rows[2].samples(kind).push(t2 - t0);
    }
}

fn uncontended(addrs: &[SocketAddr], plan: &Plan, rows: &mut Vec<Row>) {
    for n in NODES {
        eprintln!("uncontended, N={n}");
        let first = rows.len();
        for what in ["acquire", "release", "acquire+release"] {
            rows.push(Row::new(format!("{what}, N={n}")));
        }
        let mut lockers: Vec<Locker> = Kind::ALL
            .iter()
            .map(|&kind| {
                let mut l = Locker::new(kind, &addrs[..n]);
                warm_up(&mut l, &key(kind, "uncontended"), 20);
                l
            })
            .collect();
        for round in 0..plan.rounds {
            for kind in order(round) {
                uncontended_block(
                    &mut lockers[index(kind)],
                    &key(kind, "uncontended"),
                    plan,
                    &mut rows[first..first + 3],
                    kind,
                );
            }
        }
    }
}

/// One hand-off block: two clients of `kind` take turns on one key. Returns the gaps and how
/// many waits timed out.
fn handoff_block(kind: Kind, addrs: &[SocketAddr], plan: &Plan) -> (Vec<Duration>, usize) {
    let target = if kind.sleeps_between_retries() {
        plan.handoff_slow
    } else {
        plan.handoff_fast
    };
    let key = key(kind, "handoff");
    let base = Instant::now();
    // When the last release started, in ns after `base` (0: none yet).
    let released_at = AtomicU64::new(0);
    let acquisitions = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failures = AtomicUsize::new(0);
    let gaps = Mutex::new(Vec::with_capacity(target + 2));
    let ready = Barrier::new(2);
    let deadline = Mutex::new(None::<Instant>);
    thread::scope(|s| {
        for me in 0..2 {
            let (key, released_at, acquisitions, stop, failures, gaps, ready, deadline) = (
                &key,
                &released_at,
                &acquisitions,
                &stop,
                &failures,
                &gaps,
                &ready,
                &deadline,
            );
            s.spawn(move || {
                let mut locker = Locker::new(kind, addrs);
                warm_up(&mut locker, key, 3);
                if ready.wait().is_leader() {
                    *deadline.lock().unwrap() = Some(Instant::now() + plan.handoff_time);
                }
                ready.wait();
                let deadline = deadline.lock().unwrap().expect("set by the leader");
                let give_up = deadline + Duration::from_secs(2);
                if me == 1 {
                    // Client 0 takes the lock first; client 1 then queues behind it.
                    while acquisitions.load(Ordering::SeqCst) == 0 && Instant::now() < give_up {
                        thread::sleep(Duration::from_micros(20));
                    }
                }
                while !stop.load(Ordering::SeqCst) {
                    let Some(guard) = locker.wait_acquire(key, give_up) else {
                        failures.fetch_add(1, Ordering::SeqCst);
                        stop.store(true, Ordering::SeqCst);
                        break;
                    };
                    let acquired = Instant::now();
                    let k = acquisitions.fetch_add(1, Ordering::SeqCst) + 1;
                    let r = released_at.load(Ordering::SeqCst);
                    if r != 0 {
                        let released = base + Duration::from_nanos(r);
                        gaps.lock()
                            .unwrap()
                            .push(acquired.saturating_duration_since(released));
                    }
                    if k > target || Instant::now() >= deadline {
                        stop.store(true, Ordering::SeqCst);
                    }
                    thread::sleep(HOLD);
                    released_at.store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
                    if !locker.release(key, guard) {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                    // Let the other client take it before queueing again.
                    while acquisitions.load(Ordering::SeqCst) == k
                        && !stop.load(Ordering::SeqCst)
                        && Instant::now() < give_up
                    {
                        thread::sleep(Duration::from_micros(20));
                    }
                }
            });
        }
    });
    (gaps.into_inner().unwrap(), failures.into_inner())
}

fn handoff(addrs: &[SocketAddr], plan: &Plan, rows: &mut Vec<Row>) {
    eprintln!("hand-off, N={}", addrs.len());
    let mut row = Row::new(format!(
        "hand-off (hold {} ms), N={}",
        HOLD.as_millis(),
        addrs.len()
    ));
    for round in 0..plan.handoff_rounds {
        for kind in order(round) {
            let (gaps, failed) = handoff_block(kind, addrs, plan);
            row.failures[index(kind)] += failed;
            let s = row.samples(kind);
            gaps.into_iter().for_each(|g| s.push(g));
        }
    }
    rows.push(row);
}

/// The figures of one cell: p50 and p99.
fn figures(cell: &mut Option<Cell>) -> Option<(Duration, Duration)> {
    match cell.as_mut()? {
        Cell::Latency(s) if !s.is_empty() => Some((s.quantile(0.5), s.quantile(0.99))),
        Cell::Latency(_) => None,
    }
}

fn fmt_ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{a:.2}× / {b:.2}×"),
        _ => "–".into(),
    }
}

/// What the table says for the targets of the issue, at N = 5.
struct Targets {
    lines: Vec<String>,
}

impl Targets {
    fn check(&mut self, what: &str, value: Option<f64>, limit: f64, unit: &str) {
        let line = match value {
            Some(v) => format!(
                "- {what}: {v:.3}{unit} (target ≤ {limit:.3}{unit}) {}",
                if v <= limit { "met" } else { "NOT met" }
            ),
            None => format!("- {what}: no figure"),
        };
        self.lines.push(line);
    }
}

fn render(rows: &mut [Row]) -> (String, Targets) {
    let mut out = String::new();
    out.push_str("| workload |");
    for k in Kind::ALL {
        out.push_str(&format!(" {} |", k.name()));
    }
    out.push_str(" ours ÷ raw | ours ÷ best peer |\n|---|");
    for _ in Kind::ALL {
        out.push_str("---:|");
    }
    out.push_str("---:|---:|\n");
    let mut targets = Targets { lines: Vec::new() };
    for row in rows.iter_mut() {
        let figs: Vec<Option<(Duration, Duration)>> = row.cells.iter_mut().map(figures).collect();
        out.push_str(&format!("| {} |", row.name));
        for (fig, &failed) in figs.iter().zip(&row.failures) {
            let text = match fig {
                Some((p50, p99)) => format!("{} / {}", fmt_duration(*p50), fmt_duration(*p99)),
                None => "–".into(),
            };
            if failed > 0 {
                out.push_str(&format!(" {text} ({failed} failed) |"));
            } else {
                out.push_str(&format!(" {text} |"));
            }
        }
        let ours = figs[index(Kind::Ours)];
        let raw = figs[index(Kind::Raw)];
        let rawq = figs[index(Kind::RawQ)];
        let r = |f: fn(&(Duration, Duration)) -> Duration, other: Option<(Duration, Duration)>| {
            ours.zip(other)
                .filter(|(_, t)| !f(t).is_zero())
                .map(|(o, t)| ratio(f(&o), f(&t)))
        };
        let p50 = |x: &(Duration, Duration)| x.0;
        let p99 = |x: &(Duration, Duration)| x.1;
        out.push_str(&format!(" {} |", fmt_ratio(r(p50, raw), r(p99, raw))));
        // The best peer for each figure separately.
        let peers: Vec<(Kind, (Duration, Duration))> = Kind::ALL
            .iter()
            .filter(|k| k.is_peer())
            .filter_map(|&k| figs[index(k)].map(|f| (k, f)))
            .collect();
        let best50 = peers.iter().min_by_key(|(_, f)| f.0);
        let best99 = peers.iter().min_by_key(|(_, f)| f.1);
        match (best50, best99) {
            (Some(b50), Some(b99)) => {
                let names = if b50.0 == b99.0 {
                    b50.0.name().to_string()
                } else {
                    format!("{}, {}", b50.0.name(), b99.0.name())
                };
                out.push_str(&format!(
                    " {} ({names}) |\n",
                    fmt_ratio(r(p50, Some(b50.1)), r(p99, Some(b99.1)))
                ));
            }
            _ => out.push_str(" – |\n"),
        }
        let rslock = figs[index(Kind::Rslock)];
        match row.name.as_str() {
            "acquire, N=5" => {
                targets.check("acquire p50, ours ÷ raw", r(p50, raw), 1.0, "×");
                targets.check("acquire p50, ours ÷ rawQ", r(p50, rawq), 1.05, "×");
                targets.check("acquire p99, ours ÷ rawQ", r(p99, rawq), 1.05, "×");
                targets.check("acquire p50, ours ÷ rslock", r(p50, rslock), 1.0 / 1.3, "×");
                targets.check("acquire p99, ours ÷ rslock", r(p99, rslock), 1.0 / 1.3, "×");
            }
            "acquire+release, N=5" => {
                targets.check("acquire+release p50, ours ÷ raw", r(p50, raw), 1.05, "×");
                targets.check(
                    "acquire+release p50, ours ÷ rslock",
                    r(p50, rslock),
                    1.0 / 1.3,
                    "×",
                );
                targets.check(
                    "acquire+release p99, ours ÷ rslock",
                    r(p99, rslock),
                    1.0 / 1.3,
                    "×",
                );
            }
            name if name.starts_with("hand-off") => {
                let ms = ours.map(|o| o.0.as_secs_f64() * 1e3);
                targets.check("hand-off p50", ms, 1.0, " ms");
            }
            _ => {}
        }
    }
    (out, targets)
}

/// Where this ran, for the README.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let redis = std::process::Command::new(
        std::env::var("REDLOCK_MUX_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
    )
    .arg("--version")
    .output()
    .ok()
    .and_then(|o| String::from_utf8(o.stdout).ok())
    .and_then(|s| {
        s.split_whitespace()
            .nth(2)
            .map(|v| v.trim_start_matches("v=").to_string())
    })
    .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}, redis-server {redis}, all on 127.0.0.1")
}

fn main() {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => {
                println!("usage: redlock-mux-peers [--quick]\n\nMeasures lock latency of redlock-mux, raw baselines, rslock, redlock and redsync,\nread and write locks next to rawQ-rw (N = 5),\nand scale (T = 1, 4, 16, 64 threads on distinct keys: redlock-mux, rawN, rawQ,\nrslock from threads and from tasks), against local redis-server processes it\nstarts; prints Markdown tables. --quick: shorter blocks and cells, one round.");
                return;
            }
            other => {
                eprintln!("unknown argument {other:?}; try --help");
                std::process::exit(2);
            }
        }
    }
    let plan = if quick { &QUICK } else { &FULL };
    let started = Instant::now();
    let cluster = RedisCluster::start(5).expect("start redis-server (run `bash .ci/install`)");
    let addrs = cluster.addrs();
    let mut rows = Vec::new();
    uncontended(&addrs, plan, &mut rows);
    handoff(&addrs, plan, &mut rows);
    let rw_table = read_write(&addrs, plan);
    let mut scale = scale::run(&addrs, plan.scale_cell, plan.scale_rounds);
    let (table, targets) = render(&mut rows);
    let elapsed = started.elapsed();
    println!("Machine: {}", machine());
    println!(
        "Mode: {}; took {:.0} s. Cells are p50 / p99; ratios are\nours ÷ theirs in time per operation, so below 1 means redlock-mux is faster.\n",
        if quick { "--quick" } else { "full" },
        elapsed.as_secs_f64()
    );
    println!("{table}");
    println!(
        "Samples per cell ({}):",
        Kind::ALL.map(Kind::name).join(" / ")
    );
    for row in &rows {
        let counts: Vec<String> = row
            .cells
            .iter()
            .map(|c| match c {
                Some(Cell::Latency(s)) => s.len().to_string(),
                None => "0".into(),
            })
            .collect();
        println!("- {}: {}", row.name, counts.join(" / "));
    }
    println!("\nTargets (N = 5):");
    for line in &targets.lines {
        println!("{line}");
    }
    println!("\n{rw_table}");
    println!("\n{}", scale.render());
}

/// Read and write locks at N = 5, uncontended: redlock-mux next to `rawQ-rw`, in alternating
/// blocks. Returns a Markdown table (p50 / p99, and ours ÷ rawQ-rw) with the targets.
fn read_write(addrs: &[SocketAddr], plan: &Plan) -> String {
    use raw::{RawQRw, Side, Target, Tokens};
    eprintln!("read-write, N={}", addrs.len());
    let client = redlock_mux::Client::builder()
        .nodes(addrs.iter().map(|a| format!("redis://{a}")))
        .build()
        .expect("client");
    let targets: Vec<Target> = addrs.iter().copied().map(Target::plain).collect();
    let mut rawq = RawQRw::connect_targets(&targets).expect("rawQ-rw connects");
    let mut tokens = Tokens::new();
    let ttl_ms = lockers::TTL.as_millis() as u64;
    // [side][ours, rawQ-rw][acquire, release, acquire+release]
    let mut samples: [[[Samples; 3]; 2]; 2] = Default::default();
    let mut failures = [[0usize; 2]; 2];
    let sides = [(Side::Read, "read"), (Side::Write, "write")];
    for round in 0..plan.rounds + 1 {
        // The first round warms up and is not kept.
        let keep = round > 0;
        for (si, &(side, name)) in sides.iter().enumerate() {
            for who in [(round % 2), 1 - (round % 2)] {
                let end = Instant::now() + plan.block_time;
                for _ in 0..plan.block_iters {
                    if Instant::now() >= end {
                        break;
                    }
                    let t0 = Instant::now();
                    let ok = if who == 0 {
                        let key = format!("bench:redlock-mux:rw:{name}");
                        match side {
                            Side::Read => client.try_read_lock(&key, lockers::TTL).map(|g| {
                                let t1 = Instant::now();
                                (t1, g.release().is_ok())
                            }),
                            Side::Write => client.try_write_lock(&key, lockers::TTL).map(|g| {
                                let t1 = Instant::now();
                                (t1, g.release().is_ok())
                            }),
                        }
                        .ok()
                    } else {
                        let (r, w) = (
                            format!("bench:rawq-rw:{name}:r"),
                            format!("bench:rawq-rw:{name}:w"),
                        );
                        let token = tokens.next_token();
                        match rawq.try_acquire(side, r.as_bytes(), w.as_bytes(), &token, ttl_ms) {
                            Ok(true) => {
                                let t1 = Instant::now();
                                let released =
                                    rawq.release(side, r.as_bytes(), w.as_bytes(), &token);
                                Some((t1, released.is_ok()))
                            }
                            _ => None,
                        }
                    };
                    let t2 = Instant::now();
                    match ok {
                        Some((t1, true)) if keep => {
                            let s = &mut samples[si][who];
                            s[0].push(t1 - t0);
                            s[1].push(t2 - t1);
                            s[2].push(t2 - t0);
                        }
                        Some((_, true)) => {}
                        _ => failures[si][who] += 1,
                    }
                }
            }
        }
    }
    let mut out = String::from(
        "Read-write locks, uncontended, N = 5: redlock-mux next to rawQ-rw (the read-write lock design's acquire scripts by EVALSHA\nto all N sockets at once, returning at the quorum). Cells are p50 / p99.\n\n| workload | redlock-mux | rawQ-rw | ours ÷ rawQ-rw |\n|---|---:|---:|---:|\n",
    );
    let mut goals = String::from("\nTargets (N = 5, Redis 7: acquire p50 ≤ 1.05× rawQ-rw):\n");
    let r = |a: Duration, b: Duration| (!b.is_zero()).then(|| ratio(a, b));
    let mut fails = String::from("\n");
    for (si, &(_, name)) in sides.iter().enumerate() {
        let [ours, base] = &mut samples[si];
        for (pi, what) in ["acquire", "release", "acquire+release"].iter().enumerate() {
            let (o, b) = (&mut ours[pi], &mut base[pi]);
            let (o50, o99, b50, b99) = (
                o.quantile(0.5),
                o.quantile(0.99),
                b.quantile(0.5),
                b.quantile(0.99),
            );
            out.push_str(&format!(
                "| {name} {what} | {} / {} | {} / {} | {} |\n",
                fmt_duration(o50),
                fmt_duration(o99),
                fmt_duration(b50),
                fmt_duration(b99),
                fmt_ratio(r(o50, b50), r(o99, b99)),
            ));
            if pi == 0 {
                let v = r(o50, b50);
                goals.push_str(&match v {
                    Some(v) => format!(
                        "- {name} acquire p50, ours ÷ rawQ-rw: {v:.3}× {}\n",
                        if v <= 1.05 { "met" } else { "NOT met" }
                    ),
                    None => format!("- {name} acquire p50: no figure\n"),
                });
            }
        }
        fails.push_str(&format!(
            "Failed cycles ({name}, redlock-mux / rawQ-rw): {} / {}\n",
            failures[si][0], failures[si][1]
        ));
    }
    out + &fails + &goals
}
