//! A write lock's downgrade to a read lock next to a mutex extend: each one round on a held
//! lock.

use std::io::{self, Write};
use std::time::Instant;

use redlock_mux::Client;
use serde_json::json;

use crate::stats::{fmt_duration, ratio, Fixed, Samples};
use crate::Fail;

use super::phases::summary_json;
use super::{Progress, BLOCK, TTL};

/// Downgrade figures at one N, next to a mutex extend measured in the same run.
pub(super) struct DowngradeResult {
    pub(super) n: usize,
    /// `WriteLock::downgrade` of a held write lock.
    pub(super) downgrade: Samples,
    /// `Lock::extend` of a held mutex, to the same TTL.
    pub(super) extend: Samples,
    pub(super) errors: u64,
}

/// Alternating blocks of: take a mutex, time its extend, release it; take a write lock, time
/// its downgrade, release the read lock. Both timed operations are one round on a held lock.
pub(super) fn bench_downgrade(
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

pub(super) fn print_downgrade(
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
            Fixed(ratio(d.p50, e.p50)),
            fmt_duration(d.p99),
            fmt_duration(e.p99),
            Fixed(ratio(d.p99, e.p99)),
            r.errors,
        )?;
    }
    Ok(())
}

/// Every N's figures as JSON.
pub(super) fn json(results: &mut [DowngradeResult]) -> Vec<serde_json::Value> {
    results
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
        .collect()
}
