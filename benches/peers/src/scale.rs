//! Scale: T threads (or tasks) loop try-lock + release, each on a key of its own, at N = 5.
//!
//! For each T and implementation, timed cells (implementations in rotating order, a few
//! rounds): aggregate operations per second (median of the rounds), acquire and cycle latency
//! (every cycle of every round), failed calls, connections per node and server CPU per cycle.
//! The last two come from the servers themselves, through one probe connection per node:
//! `CLIENT LIST` (less the probe's own connection and whatever the node had before the cell;
//! pub/sub connections counted apart as well) and `INFO cpu` (`used_cpu_user` + `used_cpu_sys`, summed over the
//! nodes, from just before the threads start to just after the last one ends, divided by the
//! cycles).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::lockers::TTL;
use crate::raw::{raw_cycle, Connections, Probe, Raw, Tokens};
use crate::stats::{failure_kind, fmt_duration, ratio, Samples};

/// Thread counts measured.
pub const THREADS: [usize; 4] = [1, 4, 16, 64];
/// Most cycles one cell records, whatever its length.
const CELL_CAP: usize = 1_000_000;
/// Unmeasured cycles each thread or task runs first.
const WARMUP: usize = 20;
/// Distinct failure messages kept per cell row; later ones count as "other".
const REASONS: usize = 6;
/// The longest an rslock call may take here (it has no timeout of its own): a call that takes
/// longer counts as failed, so that no cell outlives its length by much.
const RSLOCK_LIMIT: Duration = Duration::from_secs(5);

/// One rslock try-lock + release, bounded by [`RSLOCK_LIMIT`]: when the lock was acquired, or
/// why it failed.
async fn rslock_cycle(manager: &rslock::LockManager, key: &str) -> Result<Instant, String> {
    let limit = || format!("no answer within {} s", RSLOCK_LIMIT.as_secs());
    let lock = tokio::time::timeout(RSLOCK_LIMIT, manager.lock(key, TTL))
        .await
        .map_err(|_| limit())?
        .map_err(|e| e.to_string())?;
    let acquired = Instant::now();
    tokio::time::timeout(RSLOCK_LIMIT, lock.release())
        .await
        .map_err(|_| format!("release: {}", limit()))?;
    Ok(acquired)
}

/// The implementations of the scale table, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// One `redlock_mux::Client` shared by every thread.
    Ours,
    /// The raw baseline returning at the quorum, one connection set per thread.
    RawN,
    /// The same raw client, alone: the ideal single caller. Measured at T = 1 only.
    RawQ,
    /// One shared `rslock::LockManager`, driven from OS threads through one multi-thread
    /// runtime (`Handle::block_on` per call).
    RslockThreads,
    /// One shared `rslock::LockManager`, driven from T tasks on one multi-thread runtime.
    RslockTasks,
}

impl Who {
    /// Every implementation, in table order.
    pub const ALL: [Who; 5] = [
        Who::Ours,
        Who::RawN,
        Who::RawQ,
        Who::RslockThreads,
        Who::RslockTasks,
    ];

    /// The row name.
    pub fn name(self) -> &'static str {
        match self {
            Who::Ours => "redlock-mux",
            Who::RawN => "rawN",
            Who::RawQ => "rawQ",
            Who::RslockThreads => "rslock (threads)",
            Who::RslockTasks => "rslock (tasks)",
        }
    }

    fn runs_at(self, threads: usize) -> bool {
        self != Who::RawQ || threads == 1
    }
}

/// One implementation's figures at one T, over every round.
#[derive(Default)]
pub struct Figures {
    acquire: Samples,
    cycle: Samples,
    rates: Vec<f64>,
    cpu_per_cycle: Vec<f64>,
    conns: Vec<u64>,
    subs: Vec<u64>,
    failures: BTreeMap<String, u64>,
}

impl Figures {
    fn ops(&self) -> f64 {
        median(&self.rates)
    }

    fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    fn conns(&self) -> u64 {
        self.conns.iter().copied().max().unwrap_or(0)
    }

    fn subs(&self) -> u64 {
        self.subs.iter().copied().max().unwrap_or(0)
    }

    fn fail(&mut self, why: String, count: u64) {
        let why = failure_kind(&why);
        let why = if self.failures.len() >= REASONS && !self.failures.contains_key(&why) {
            "other".to_owned()
        } else {
            why
        };
        *self.failures.entry(why).or_insert(0) += count;
    }

    fn measured(&self) -> bool {
        !self.rates.is_empty()
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Every figure of the scale section: `[T index][Who index]`.
pub struct Scale {
    figures: Vec<Vec<Figures>>,
    cell: Duration,
    rounds: usize,
}

fn index(who: Who) -> usize {
    Who::ALL.iter().position(|w| *w == who).unwrap_or(0)
}

/// What one thread or task measured in a cell.
#[derive(Default)]
struct Run {
    acquire: Samples,
    cycle: Samples,
    failures: Vec<(String, u64)>,
    ended: Option<Instant>,
}

impl Run {
    fn fail(&mut self, why: String) {
        match self.failures.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => self.failures.push((why, 1)),
        }
    }
}

/// Runs the scale section: `rounds` rounds of `cell`-long cells at each T.
pub fn run(addrs: &[SocketAddr], cell: Duration, rounds: usize) -> Scale {
    let mut probes: Vec<Probe> = addrs
        .iter()
        .map(|&a| Probe::connect_addr(a).expect("probe connection"))
        .collect();
    let idle = clients(&mut probes);
    let mut figures = Vec::new();
    for threads in THREADS {
        eprintln!("scale, T={threads}, N={}", addrs.len());
        let mut row: Vec<Figures> = Who::ALL.iter().map(|_| Figures::default()).collect();
        for round in 0..rounds {
            let n = Who::ALL.len();
            for k in 0..n {
                let who = Who::ALL[(k + round) % n];
                if who.runs_at(threads) {
                    let key = format!("bench:scale:{}:{threads}:{round}", who.name());
                    cell_run(
                        who,
                        addrs,
                        threads,
                        cell,
                        &key,
                        &mut probes,
                        &idle,
                        &mut row[index(who)],
                    );
                }
            }
        }
        figures.push(row);
    }
    Scale {
        figures,
        cell,
        rounds,
    }
}

/// Each node's client connections, without the probe's own.
fn clients(probes: &mut [Probe]) -> Vec<Connections> {
    probes
        .iter_mut()
        .map(|p| p.connections().expect("CLIENT LIST"))
        .collect()
}

/// The nodes' CPU time so far, summed.
fn server_cpu(probes: &mut [Probe]) -> Duration {
    probes.iter_mut().map(|p| p.cpu().expect("INFO cpu")).sum()
}

/// What a cell's driver does between "every thread is warmed up" and "every thread is done":
/// reads the servers' CPU, starts the threads, samples connections, and collects.
struct Meter<'a> {
    probes: &'a mut [Probe],
    before: Vec<Connections>,
    cpu: Duration,
    start: Instant,
    conns: u64,
    subs: u64,
}

impl<'a> Meter<'a> {
    /// Waits (up to a few seconds) for the previous cell's connections to go, then notes what
    /// each node has.
    fn settle(probes: &'a mut [Probe], idle: &[Connections]) -> Meter<'a> {
        let until = Instant::now() + Duration::from_secs(3);
        let mut before = clients(probes);
        while before.iter().zip(idle).any(|(b, i)| b.all > i.all) && Instant::now() < until {
            thread::sleep(Duration::from_millis(20));
            before = clients(probes);
        }
        Meter {
            probes,
            before,
            cpu: Duration::ZERO,
            start: Instant::now(),
            conns: 0,
            subs: 0,
        }
    }

    /// Every worker is ready: note the CPU, and the start.
    fn ready(&mut self) {
        self.cpu = server_cpu(self.probes);
        self.start = Instant::now();
    }

    /// Samples connections per node at a quarter, half and three quarters of the cell.
    fn watch(&mut self, cell: Duration) {
        for quarter in 1..=3u32 {
            let at = self.start + cell * quarter / 4;
            thread::sleep(at.saturating_duration_since(Instant::now()));
            for (c, b) in clients(self.probes).iter().zip(&self.before) {
                self.conns = self.conns.max(c.all.saturating_sub(b.all));
                self.subs = self.subs.max(c.subscribers.saturating_sub(b.subscribers));
            }
        }
    }

    /// Adds the runs' figures, the rate, CPU per cycle and connections to `into`.
    fn finish(self, runs: Vec<Run>, into: &mut Figures) {
        let mut end = self.start;
        let mut cycles = 0;
        for run in runs {
            cycles += run.cycle.len();
            into.acquire.extend(&run.acquire);
            into.cycle.extend(&run.cycle);
            for (why, n) in run.failures {
                into.fail(why, n);
            }
            end = end.max(run.ended.unwrap_or(end));
        }
        let cpu = server_cpu(self.probes).saturating_sub(self.cpu);
        let wall = (end - self.start).as_secs_f64();
        into.rates.push(if wall > 0.0 {
            cycles as f64 / wall
        } else {
            0.0
        });
        into.cpu_per_cycle.push(if cycles > 0 {
            cpu.as_secs_f64() * 1e6 / cycles as f64
        } else {
            0.0
        });
        into.conns.push(self.conns);
        into.subs.push(self.subs);
    }
}

fn urls(addrs: &[SocketAddr]) -> Vec<String> {
    addrs.iter().map(|a| format!("redis://{a}")).collect()
}

/// A multi-thread runtime with its default worker count (one per core).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[allow(clippy::too_many_arguments)]
fn cell_run(
    who: Who,
    addrs: &[SocketAddr],
    threads: usize,
    cell: Duration,
    key: &str,
    probes: &mut [Probe],
    idle: &[Connections],
    into: &mut Figures,
) {
    let mut meter = Meter::settle(probes, idle);
    let per_thread = (CELL_CAP / threads).max(1);
    let runs = match who {
        Who::RslockTasks => {
            return tasks_cell(threads, cell, key, addrs, meter, per_thread, into);
        }
        Who::Ours | Who::RawN | Who::RawQ | Who::RslockThreads => {
            let ready = Arc::new(Barrier::new(threads + 1));
            let go = Arc::new(Barrier::new(threads + 1));
            let client =
                (who == Who::Ours).then(|| redlock_mux::Client::new(urls(addrs)).expect("client"));
            let rt = (who == Who::RslockThreads).then(runtime);
            let manager = rt.as_ref().map(|rt| {
                let _entered = rt.enter();
                rslock::LockManager::new(urls(addrs))
            });
            thread::scope(|s| {
                let workers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (ready, go) = (ready.clone(), go.clone());
                        let key = format!("{key}:{t}");
                        let (client, rt, manager) = (&client, &rt, &manager);
                        s.spawn(move || {
                            let mut locker = match who {
                                Who::Ours => Locker::Ours(client.clone().expect("client")),
                                Who::RslockThreads => Locker::Rslock(
                                    rt.as_ref().expect("runtime").handle().clone(),
                                    manager.clone().expect("manager"),
                                ),
                                _ => Locker::Raw(
                                    Raw::connect(addrs).map(Raw::at_quorum).ok(),
                                    Tokens::new(),
                                ),
                            };
                            for _ in 0..WARMUP {
                                let _ = locker.cycle(&key);
                            }
                            ready.wait();
                            go.wait();
                            let deadline = Instant::now() + cell;
                            let mut run = Run::default();
                            while run.cycle.len() < per_thread && Instant::now() < deadline {
                                let start = Instant::now();
                                match locker.cycle(&key) {
                                    Ok(acquired) => {
                                        run.acquire.push(acquired - start);
                                        run.cycle.push(start.elapsed());
                                    }
                                    Err(why) => {
                                        run.fail(why);
                                        if locker.broken() {
                                            break;
                                        }
                                    }
                                }
                            }
                            run.ended = Some(Instant::now());
                            run
                        })
                    })
                    .collect();
                ready.wait();
                meter.ready();
                go.wait();
                meter.watch(cell);
                workers
                    .into_iter()
                    .map(|w| w.join().expect("a benchmark thread panicked"))
                    .collect::<Vec<Run>>()
            })
        }
    };
    meter.finish(runs, into);
}

/// rslock from `threads` tasks on one multi-thread runtime, sharing one `LockManager`.
fn tasks_cell(
    threads: usize,
    cell: Duration,
    key: &str,
    addrs: &[SocketAddr],
    mut meter: Meter<'_>,
    per_thread: usize,
    into: &mut Figures,
) {
    let rt = runtime();
    let manager = {
        let _entered = rt.enter();
        rslock::LockManager::new(urls(addrs))
    };
    let ready = Arc::new(tokio::sync::Barrier::new(threads + 1));
    let go = Arc::new(tokio::sync::Barrier::new(threads + 1));
    let tasks: Vec<_> = (0..threads)
        .map(|t| {
            let (ready, go, manager) = (ready.clone(), go.clone(), manager.clone());
            let key = format!("{key}:{t}");
            rt.spawn(async move {
                for _ in 0..WARMUP {
                    let _ = rslock_cycle(&manager, &key).await;
                }
                ready.wait().await;
                go.wait().await;
                let deadline = Instant::now() + cell;
                let mut run = Run::default();
                while run.cycle.len() < per_thread && Instant::now() < deadline {
                    let start = Instant::now();
                    match rslock_cycle(&manager, &key).await {
                        Ok(acquired) => {
                            run.acquire.push(acquired - start);
                            run.cycle.push(start.elapsed());
                        }
                        Err(why) => run.fail(why),
                    }
                }
                run.ended = Some(Instant::now());
                run
            })
        })
        .collect();
    rt.block_on(ready.wait());
    meter.ready();
    rt.block_on(go.wait());
    meter.watch(cell);
    let runs: Vec<Run> = rt.block_on(async {
        let mut runs = Vec::with_capacity(tasks.len());
        for task in tasks {
            runs.push(task.await.expect("a benchmark task panicked"));
        }
        runs
    });
    meter.finish(runs, into);
}

/// One thread's client.
enum Locker {
    Ours(redlock_mux::Client),
    /// The raw client (None once an I/O error broke it) and its tokens.
    Raw(Option<Raw>, Tokens),
    Rslock(tokio::runtime::Handle, rslock::LockManager),
}

impl Locker {
    fn broken(&self) -> bool {
        matches!(self, Locker::Raw(None, _))
    }

    /// One try-lock and release: when the lock was acquired, or why it failed.
    fn cycle(&mut self, key: &str) -> Result<Instant, String> {
        match self {
            Locker::Ours(c) => {
                let lock = c.try_lock(key, TTL).map_err(|e| e.to_string())?;
                let acquired = Instant::now();
                lock.release().map_err(|e| format!("release: {e}"))?;
                Ok(acquired)
            }
            Locker::Raw(slot, tokens) => {
                raw_cycle(slot, tokens, key.as_bytes(), TTL.as_millis() as u64)
            }
            Locker::Rslock(rt, m) => rt.block_on(rslock_cycle(m, key)),
        }
    }
}

fn fmt_rate(r: f64) -> String {
    if r >= 1000.0 {
        format!("{:.2}k", r / 1000.0)
    } else {
        format!("{r:.0}")
    }
}

impl Scale {
    fn get(&self, threads: usize, who: Who) -> Option<&Figures> {
        let t = THREADS.iter().position(|&x| x == threads)?;
        self.figures.get(t).map(|row| &row[index(who)])
    }

    fn get_mut(&mut self, threads: usize, who: Who) -> Option<&mut Figures> {
        let t = THREADS.iter().position(|&x| x == threads)?;
        self.figures.get_mut(t).map(|row| &mut row[index(who)])
    }

    /// The table (Markdown), the ratios and the failures.
    pub fn render(&mut self) -> String {
        let mut out = format!(
            "Scale, N = 5: T threads (or tasks) loop try-lock + release, each on its own key; {} per cell, {} round{}, implementations in rotating order. ops/s: median of the rounds; latencies: every cycle of every round; conns/node: most connections any node had from the implementation during a cell (CLIENT LIST; the probe's not counted), of which pub/sub in parentheses when any; server CPU/cycle: user + sys of all nodes per cycle (median of the rounds).\n\n",
            fmt_duration(self.cell),
            self.rounds,
            if self.rounds == 1 { "" } else { "s" }
        );
        out.push_str("| T | client | ops/s | acquire p50 / p99 | cycle p50 / p99 | failed | conns/node | server CPU/cycle |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
        let mut failures = Vec::new();
        for (t, row) in self.figures.iter_mut().enumerate() {
            for (w, f) in row.iter_mut().enumerate() {
                if !f.measured() {
                    continue;
                }
                let (a50, a99) = (f.acquire.quantile(0.5), f.acquire.quantile(0.99));
                let (c50, c99) = (f.cycle.quantile(0.5), f.cycle.quantile(0.99));
                out.push_str(&format!(
                    "| {} | {} | {} | {} / {} | {} / {} | {} | {}{} | {:.1}µs |\n",
                    THREADS[t],
                    Who::ALL[w].name(),
                    fmt_rate(f.ops()),
                    fmt_duration(a50),
                    fmt_duration(a99),
                    fmt_duration(c50),
                    fmt_duration(c99),
                    f.failed(),
                    f.conns(),
                    match f.subs() {
                        0 => String::new(),
                        subs => format!(" ({subs} pub/sub)"),
                    },
                    median(&f.cpu_per_cycle),
                ));
                for (why, n) in &f.failures {
                    failures.push(format!(
                        "- T={} {}: {n} × {why}",
                        THREADS[t],
                        Who::ALL[w].name()
                    ));
                }
            }
        }
        out.push_str("\nRatios (N = 5, this run):\n\n");
        let top = THREADS[THREADS.len() - 1];
        let ours_top = self.get(top, Who::Ours).map(Figures::ops);
        let rslock_best = [Who::RslockThreads, Who::RslockTasks]
            .iter()
            .filter_map(|&w| self.get(top, w).map(|f| (w, f.ops())))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let ours_one = self.get(1, Who::Ours).map(Figures::ops);
        let mut line = |what: String, value: Option<f64>, target: &str, met: fn(f64) -> bool| {
            out.push_str(&match value {
                Some(v) if v.is_finite() => format!(
                    "- {what}: {v:.2}× (target {target}) {}\n",
                    if met(v) { "met" } else { "NOT met" }
                ),
                _ => format!("- {what}: no figure\n"),
            });
        };
        line(
            format!(
                "ops/s, redlock-mux at T={top} ÷ rslock's best mode at T={top} ({})",
                rslock_best.map_or("–", |(w, _)| w.name())
            ),
            ours_top.zip(rslock_best).map(|(o, (_, r))| o / r),
            "≥ 1.3×",
            |v| v >= 1.3,
        );
        line(
            format!("ops/s, redlock-mux at T={top} ÷ redlock-mux at T=1"),
            ours_top.zip(ours_one).map(|(a, b)| a / b),
            "≥ 1.5×",
            |v| v >= 1.5,
        );
        let ours1 = self.get_mut(1, Who::Ours).map(|f| {
            (
                f.acquire.quantile(0.5),
                f.acquire.quantile(0.99),
                f.cycle.quantile(0.5),
                f.cycle.quantile(0.99),
            )
        });
        let rawq = self.get_mut(1, Who::RawQ).map(|f| {
            (
                f.acquire.quantile(0.5),
                f.acquire.quantile(0.99),
                f.cycle.quantile(0.5),
                f.cycle.quantile(0.99),
            )
        });
        let r = |pick: fn(&(Duration, Duration, Duration, Duration)) -> Duration| {
            ours1
                .zip(rawq)
                .filter(|(_, q)| !pick(q).is_zero())
                .map(|(o, q)| ratio(pick(&o), pick(&q)))
        };
        let mut out2 = String::new();
        let mut line2 = |what: &str, value: Option<f64>, limit: Option<f64>| {
            out2.push_str(&match (value, limit) {
                (Some(v), Some(l)) => format!(
                    "- {what}: {v:.2}× (target ≤ {l:.2}×) {}\n",
                    if v <= l { "met" } else { "NOT met" }
                ),
                (Some(v), None) => format!("- {what}: {v:.2}×\n"),
                (None, _) => format!("- {what}: no figure\n"),
            });
        };
        line2(
            "T=1 acquire p50, redlock-mux ÷ rawQ",
            r(|x| x.0),
            Some(1.05),
        );
        line2(
            "T=1 acquire p99, redlock-mux ÷ rawQ",
            r(|x| x.1),
            Some(1.05),
        );
        line2("T=1 cycle p50, redlock-mux ÷ rawQ", r(|x| x.2), None);
        line2("T=1 cycle p99, redlock-mux ÷ rawQ", r(|x| x.3), None);
        out.push_str(&out2);
        let ours_failed: u64 = THREADS
            .iter()
            .filter_map(|&t| self.get(t, Who::Ours).map(Figures::failed))
            .sum();
        out.push_str(&format!(
            "- failed calls of redlock-mux at every T: {ours_failed} (target 0) {}\n",
            if ours_failed == 0 { "met" } else { "NOT met" }
        ));
        let most = THREADS
            .iter()
            .filter_map(|&t| self.get(t, Who::Ours).map(|f| (f.conns(), f.subs())))
            .max_by_key(|(all, subs)| all.saturating_sub(*subs))
            .unwrap_or((0, 0));
        out.push_str(&format!(
            "- connections per node of redlock-mux, at the worst T: {} of which {} pub/sub (target ≤ 2 + pub/sub) {}\n",
            most.0,
            most.1,
            if most.0 <= 2 + most.1 { "met" } else { "NOT met" }
        ));
        if !failures.is_empty() {
            out.push_str("\nFailed calls:\n\n");
            for f in failures {
                out.push_str(&f);
                out.push('\n');
            }
        }
        out
    }
}
