//! The mutex next to the raw baseline, at N = 1, 3 and 5.

use std::io::{self, Write};

use redlock_mux::Client;
use serde_json::json;

use crate::raw::Tokens;
use crate::Fail;

use super::phases::{
    base_cycles, baseline, ours_cycles, phase_ratios, phases_json, print_detail_header,
    print_detail_rows, print_ratio_rows, stats_json, Kind, Phases,
};
use super::{Progress, BLOCK};

/// Mutex figures at one N.
pub(super) struct MutexResult {
    pub(super) n: usize,
    pub(super) ours: Phases,
    pub(super) baseline: Phases,
    /// The library's own statistics of the client measured.
    pub(super) stats: redlock_mux::Stats,
}

pub(super) fn bench_mutex(
    urls: &[String],
    iters: usize,
    progress: &Progress,
) -> Result<MutexResult, Fail> {
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

pub(super) fn print_mutex(
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
    Ok(())
}

/// Every N's figures as JSON.
pub(super) fn json(results: &mut [MutexResult]) -> Vec<serde_json::Value> {
    results
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
        .collect()
}
