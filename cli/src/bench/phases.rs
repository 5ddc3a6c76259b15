//! What every mode shares: the lock kinds measured, one client's latencies per phase, the
//! cycles that fill them (the library's and the raw baseline's), and how they are printed and
//! written as JSON.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use redlock_mux::{Client, Error, NodeUrl};
use serde_json::json;

use crate::args::usage;
use crate::raw::{Raw, Side, Target, Tokens};
use crate::stats::{fmt_duration, ratio, us, Fixed, Samples, Summary};
use crate::Fail;

use super::TTL;

/// The permits of the semaphore measured.
pub(super) const SEM_PERMITS: u32 = 2;

/// A lock kind measured against the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Mutex,
    Read,
    Write,
    Semaphore,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Semaphore => "semaphore",
        }
    }

    /// The side of a read-write lock this kind is, for `rawQ-rw`; `None` for the kinds
    /// measured next to the mutex only.
    pub(super) fn side(self) -> Option<Side> {
        match self {
            Kind::Read => Some(Side::Read),
            Kind::Write => Some(Side::Write),
            Kind::Mutex | Kind::Semaphore => None,
        }
    }
}

/// Latencies of one client: acquire, release, and the two back to back.
#[derive(Default)]
pub(super) struct Phases {
    pub(super) acquire: Samples,
    pub(super) release: Samples,
    pub(super) cycle: Samples,
    pub(super) errors: u64,
}

impl Phases {
    pub(super) fn with_capacity(n: usize) -> Phases {
        Phases {
            acquire: Samples::with_capacity(n),
            release: Samples::with_capacity(n),
            cycle: Samples::with_capacity(n),
            errors: 0,
        }
    }

    pub(super) fn record(&mut self, start: Instant, acquired: Instant, released: Instant) {
        self.acquire.push(acquired - start);
        self.release.push(released - acquired);
        self.cycle.push(released - start);
    }
}

/// `count` try-acquire and release cycles of `kind` on `key`, recorded into `into`.
pub(super) fn ours_cycles(client: &Client, kind: Kind, key: &str, count: usize, into: &mut Phases) {
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

pub(super) fn timed<G>(
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

pub(super) fn base_cycles(
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
pub(super) fn baseline(urls: &[String]) -> Result<Raw, Fail> {
    Raw::connect_targets(&targets(urls)?)
        .map_err(|e| Fail::other(format!("the baseline could not connect: {e}")))
}

/// The nodes of `urls` for the hand-written clients, read by the library's URL parser: `AUTH`
/// and `SELECT` as they ask, then nothing but lock commands.
pub(super) fn targets(urls: &[String]) -> Result<Vec<Target>, Fail> {
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

/// A client's statistics ([`redlock_mux::Client::stats`]) as JSON.
pub(super) fn stats_json(s: &redlock_mux::Stats) -> serde_json::Value {
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

/// Ratios of `ours` to `base` at quantile `q`, per phase.
pub(super) fn phase_ratios(q: f64, ours: &mut Phases, base: &mut Phases) -> serde_json::Value {
    json!({
        "acquire": ratio(ours.acquire.quantile(q), base.acquire.quantile(q)),
        "release": ratio(ours.release.quantile(q), base.release.quantile(q)),
        "cycle": ratio(ours.cycle.quantile(q), base.cycle.quantile(q)),
    })
}

/// Rows of p50 and p99 for `ours` next to `base`, with their ratios, one per phase.
pub(super) fn print_ratio_rows(
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
            Fixed(ratio(o.p50, b.p50)),
            fmt_duration(o.p99),
            fmt_duration(b.p99),
            Fixed(ratio(o.p99, b.p99)),
        )?;
    }
    Ok(())
}

/// The full figures of each measured client, one row per phase.
pub(super) fn print_detail_rows(
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
                format!("{:.0}", Fixed(sum.ops_per_sec()))
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

pub(super) fn print_detail_header(out: &mut dyn Write, who: &str) -> io::Result<()> {
    writeln!(
        out,
        "{:>2}  {:<8} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "N", who, "op", "p50", "p90", "p99", "p99.9", "max", "ops/s", "errors"
    )?;
    Ok(())
}

/// `a / b` for rates; 0 when `b` is zero.
pub(super) fn rate_ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// A client's figures: each phase's summary, the cycle histogram, ops/s and errors.
pub(super) fn phases_json(p: &mut Phases) -> serde_json::Value {
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
pub(super) fn summary_json(s: Summary) -> serde_json::Value {
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
pub(super) fn histogram_json(samples: &Samples) -> serde_json::Value {
    samples
        .histogram()
        .rows
        .iter()
        .map(|r| json!([r.low.as_nanos() as u64, r.high.as_nanos() as u64, r.count]))
        .collect()
}
