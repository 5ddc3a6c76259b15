//! Scale: T threads on distinct keys sharing one client, next to `rawN` (the raw baseline with
//! a connection set per thread, returning at the quorum), with what the servers report.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Client, NodeUrl};
use serde_json::json;

use crate::raw::{raw_cycle, Connections, Probe, Raw, Target, Tokens};
use crate::stats::{failure_kind, fmt_duration, ratio, us, Fixed, Samples};
use crate::Fail;

use super::phases::{histogram_json, rate_ratio, summary_json, targets};
use super::{Progress, TTL};

/// Most cycles one threads-mode cell records, whatever its length: bounds its memory.
pub(super) const CELL_CAP: usize = 1_000_000;
/// Unmeasured cycles each thread runs first (connections open, scripts load).
pub(super) const CELL_WARMUP: usize = 20;
/// Distinct failure messages kept per client and T; later ones are counted as "other".
pub(super) const REASONS: usize = 8;

/// How the threads mode runs.
pub(super) struct ScalePlan {
    /// Length of one cell: one client at one T.
    pub(super) cell: Duration,
    /// Cells per client and T; ops/s and CPU per cycle are the median of the rounds.
    pub(super) rounds: usize,
    /// The thread counts.
    pub(super) counts: Vec<usize>,
}

/// The clients of the threads mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scaler {
    /// One `Client` shared by every thread.
    Ours,
    /// The raw baseline, one connection set per thread, returning at the quorum.
    RawN,
}

impl Scaler {
    pub(super) fn name(self) -> &'static str {
        match self {
            Scaler::Ours => "ours",
            Scaler::RawN => "rawN",
        }
    }
}

/// One client's figures at one T, over every round.
#[derive(Default)]
pub(super) struct ScaleFigures {
    pub(super) acquire: Samples,
    pub(super) cycle: Samples,
    /// Operations per second of each round.
    pub(super) rates: Vec<f64>,
    /// Server CPU (user + sys, all nodes) per cycle of each round, in microseconds.
    pub(super) cpu_per_cycle: Vec<f64>,
    /// Each probed server's CPU per cycle in each round (rounds × servers), in microseconds.
    pub(super) cpu_by_server: Vec<Vec<f64>>,
    /// The most connections any node had from this client during each round.
    pub(super) conns: Vec<u64>,
    /// The most of those that were subscribers (pub/sub), during each round.
    pub(super) subs: Vec<u64>,
    /// Failed lock or release calls, by message.
    pub(super) failures: BTreeMap<String, u64>,
}

impl ScaleFigures {
    pub(super) fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    pub(super) fn ops_per_sec(&self) -> f64 {
        median(&self.rates)
    }

    pub(super) fn cpu_us_per_cycle(&self) -> f64 {
        median(&self.cpu_per_cycle)
    }

    /// The median over the rounds of each probed server's CPU per cycle, in microseconds.
    pub(super) fn cpu_us_per_cycle_by_server(&self) -> Vec<f64> {
        let servers = self.cpu_by_server.first().map_or(0, Vec::len);
        (0..servers)
            .map(|i| median(&self.cpu_by_server.iter().map(|r| r[i]).collect::<Vec<_>>()))
            .collect()
    }

    pub(super) fn connections(&self) -> u64 {
        self.conns.iter().copied().max().unwrap_or(0)
    }

    pub(super) fn subscribers(&self) -> u64 {
        self.subs.iter().copied().max().unwrap_or(0)
    }

    pub(super) fn fail(&mut self, why: String) {
        count_failure(&mut self.failures, why, 1);
    }

    pub(super) fn json(&mut self) -> serde_json::Value {
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
pub(super) fn count_failure(into: &mut BTreeMap<String, u64>, why: String, count: u64) {
    let why = failure_kind(&why);
    let why = if into.len() >= REASONS && !into.contains_key(&why) {
        "other".to_owned()
    } else {
        why
    };
    *into.entry(why).or_insert(0) += count;
}

/// The median of `values` (the upper one of an even count); 0 when empty.
pub(super) fn median(values: &[f64]) -> f64 {
    // Sorted as integers in the order of `f64::total_cmp`: the sort of `u64` the statistics
    // use already, where sorting the floats would bring a copy of the standard library's sort.
    const SIGN: u64 = 1 << 63;
    let mut keys: Vec<u64> = values
        .iter()
        .map(|v| {
            let bits = v.to_bits();
            if bits & SIGN != 0 {
                !bits
            } else {
                bits | SIGN
            }
        })
        .collect();
    keys.sort_unstable();
    keys.get(keys.len() / 2).map_or(0.0, |&k| {
        f64::from_bits(if k & SIGN != 0 { k & !SIGN } else { !k })
    })
}

/// Scale figures for one thread count: ours next to rawN.
pub(super) struct ThreadsResult {
    pub(super) n: usize,
    pub(super) threads: usize,
    pub(super) ours: ScaleFigures,
    pub(super) raw: ScaleFigures,
    /// The masters probed on each node (1 for a standalone server).
    pub(super) masters: Vec<usize>,
    /// rawN left out: a node is a Redis Cluster (the baseline addresses one server per node).
    pub(super) raw_skipped: bool,
}

/// What one thread of a cell measured.
pub(super) struct ThreadRun {
    pub(super) acquire: Samples,
    pub(super) cycle: Samples,
    pub(super) failures: BTreeMap<String, u64>,
    pub(super) ended: Instant,
}

/// The threads mode: at every T of the plan, cells of ours and of rawN in alternating order,
/// `plan.rounds` times, on all the nodes. One probe connection per node reads what the
/// servers report.
pub(super) fn bench_threads(
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
pub(super) fn clients(probes: &mut [Probe]) -> Result<Vec<Connections>, Fail> {
    probes
        .iter_mut()
        .map(|p| p.connections())
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| Fail::other(format!("CLIENT LIST: {e}")))
}

/// Each probed server's CPU time so far.
pub(super) fn server_cpus(probes: &mut [Probe]) -> Result<Vec<Duration>, Fail> {
    probes
        .iter_mut()
        .map(|p| p.cpu())
        .collect::<io::Result<Vec<Duration>>>()
        .map_err(|e| Fail::other(format!("INFO cpu: {e}")))
}

/// One cell of the threads mode: one client, T threads, a fixed length.
pub(super) struct Cell<'a> {
    pub(super) who: Scaler,
    pub(super) urls: &'a [String],
    pub(super) targets: &'a [Target],
    pub(super) threads: usize,
    pub(super) length: Duration,
    pub(super) round: usize,
    /// Each thread cycles over [`SPREAD_KEYS`] keys instead of one, so that a cluster's
    /// slots, and so its masters, share the load.
    pub(super) spread: bool,
}

/// The keys each thread of a cell cycles over when a node is a Redis Cluster.
pub(super) const SPREAD_KEYS: usize = 64;

impl Cell<'_> {
    /// Runs the cell and adds its figures to `into`. The previous cell's connections are
    /// waited out first (up to a few seconds), so that the count is this client's alone.
    pub(super) fn run(
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
pub(super) enum Locker {
    /// A clone of the one shared client.
    Ours(Client),
    /// The raw baseline: connected in the thread (None until then, or after an I/O error),
    /// with its nodes and token source.
    Raw(Option<Raw>, Vec<Target>, Tokens),
}

impl Locker {
    pub(super) fn connect(&mut self) {
        if let Locker::Raw(raw @ None, targets, _) = self {
            *raw = Raw::connect_targets(targets).ok().map(Raw::at_quorum);
        }
    }

    /// Whether this client can go on after a failure: the raw baseline cannot after an I/O
    /// error (its connections may hold stray replies).
    pub(super) fn broken(&self) -> bool {
        matches!(self, Locker::Raw(None, _, _))
    }

    /// One try-lock and release on `key`: when the lock was acquired, or why it failed.
    pub(super) fn cycle(&mut self, key: &str) -> Result<Instant, String> {
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

pub(super) fn print_threads(
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
                Fixed(f.ops_per_sec()),
                fmt_duration(a.p50),
                fmt_duration(a.p99),
                fmt_duration(c.p50),
                fmt_duration(c.p99),
                f.failed(),
                f.connections(),
                f.subscribers(),
                format!("{:.1}µs", Fixed(f.cpu_us_per_cycle())),
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
                    let each: Vec<String> =
                        part.iter().map(|c| format!("{:.1}", Fixed(*c))).collect();
                    format!("[{}]", each.join(" "))
                })
                .collect();
            let total: usize = t.masters.iter().sum();
            writeln!(
                out,
                "  T={:<4} {} µs; mean per master {:.1}µs",
                t.threads,
                nodes.join(" "),
                Fixed(t.ours.cpu_us_per_cycle() / total.max(1) as f64)
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
            Fixed(rate_ratio(t.ours.ops_per_sec(), t.raw.ops_per_sec())),
            Fixed(ratio(t.ours.cycle.quantile(0.5), t.raw.cycle.quantile(0.5))),
            Fixed(ratio(
                t.ours.cycle.quantile(0.99),
                t.raw.cycle.quantile(0.99)
            )),
        )?;
    }
    if let Some((top, one)) = scale_ratio(results) {
        writeln!(
            out,
            "  ours at T={top} ÷ ours at T=1, ops/s: {:.2}x",
            Fixed(one)
        )?;
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

/// Ours at the largest T measured ÷ ours at T = 1, in ops/s, when both were measured: the
/// largest T and the ratio.
pub(super) fn scale_ratio(results: &[ThreadsResult]) -> Option<(usize, f64)> {
    let one = results.iter().find(|t| t.threads == 1)?;
    let top = results.iter().max_by_key(|t| t.threads)?;
    (top.threads > 1).then(|| {
        (
            top.threads,
            rate_ratio(top.ours.ops_per_sec(), one.ours.ops_per_sec()),
        )
    })
}

/// How the threads mode ran, as JSON.
pub(super) fn plan_json(plan: &ScalePlan, results: &[ThreadsResult]) -> serde_json::Value {
    json!({
        "cell_s": plan.cell.as_secs_f64(),
        "rounds": plan.rounds,
        "ours_top_to_t1_ops": scale_ratio(results).map(|(_, r)| r),
    })
}

/// Every thread count's figures as JSON.
pub(super) fn json(results: &mut [ThreadsResult]) -> Vec<serde_json::Value> {
    results
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_is_the_upper_middle_in_total_order() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[2.5]), 2.5);
        assert_eq!(median(&[3.0, -1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[-0.5, -3.0, -2.0]), -2.0);
        // -0.0 sorts before 0.0, as in f64::total_cmp.
        assert!(median(&[0.0, -0.0]).is_sign_positive());
        assert!(median(&[-0.0, -0.0, 0.0]).is_sign_negative());
        assert_eq!(median(&[f64::INFINITY, 1.0, f64::NEG_INFINITY]), 1.0);
    }
}
