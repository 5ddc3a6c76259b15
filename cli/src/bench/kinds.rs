//! Read locks, write locks and the semaphore, each next to the library's own mutex measured in
//! the same run, and read and write locks next to `rawQ-rw` too.

use std::io::{self, Write};
use std::time::Instant;

use redlock_mux::Client;
use serde_json::json;

use crate::raw::{RawQRw, Side, Tokens};
use crate::stats::{fmt_duration, ratio, Fixed};
use crate::Fail;

use super::phases::{
    ours_cycles, phase_ratios, phases_json, print_detail_header, print_detail_rows,
    print_ratio_rows, targets, Kind, Phases, SEM_PERMITS,
};
use super::{Progress, BLOCK, TTL};

/// Figures of other lock kinds at one N, next to the mutex measured in the same run, and read
/// and write locks next to `rawQ-rw` too.
pub(super) struct RwResult {
    pub(super) n: usize,
    /// The mutex first, then each kind measured.
    pub(super) kinds: Vec<(Kind, Phases)>,
    /// `rawQ-rw` for each kind measured, in the order of `kinds[1..]`: for read and write
    /// locks; `None` for the semaphore.
    pub(super) raw: Vec<Option<Phases>>,
}

/// Who runs one block of an other-kinds benchmark.
#[derive(Debug, Clone, Copy)]
pub(super) enum RwClient {
    /// The library: `kinds[i]`.
    Ours(usize),
    /// `rawQ-rw`, as the kind `kinds[i + 1]` (a read or a write lock).
    Raw(usize),
}

pub(super) fn bench_rw(
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
pub(super) fn raw_rw_cycles(
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

pub(super) fn print_rw(
    out: &mut dyn Write,
    origin: &str,
    iters: usize,
    results: &mut [RwResult],
) -> io::Result<()> {
    let any_raw = results.iter().any(|r| r.raw.iter().any(Option::is_some));
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
                    Fixed(ratio(o.p50, q.p50)),
                    fmt_duration(m.p50),
                    Fixed(ratio(o.p50, m.p50)),
                    fmt_duration(o.p99),
                    fmt_duration(q.p99),
                    Fixed(ratio(o.p99, q.p99)),
                    fmt_duration(m.p99),
                    Fixed(ratio(o.p99, m.p99)),
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
    Ok(())
}

/// Every N's figures as JSON.
pub(super) fn json(results: &mut [RwResult]) -> Vec<serde_json::Value> {
    results
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
        .collect()
}
