//! Contended hand-off: threads looping lock, hold, release on one key; the figure is the gap
//! from one thread's release to another's acquire.

use std::io::{self, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::Client;
use serde_json::json;

use crate::stats::{fmt_duration, Samples};
use crate::Fail;

use super::phases::{histogram_json, summary_json};
use super::{Progress, TTL};

/// How long each contending thread holds the lock in a hand-off.
pub(super) const HANDOFF_HOLD: Duration = Duration::from_millis(1);
/// How long each hand-off configuration runs.
pub(super) const HANDOFF_RUN: Duration = Duration::from_secs(3);
/// Grants in the first part of a hand-off run are not counted: connections for waiting
/// (subscriptions) open on first use.
pub(super) const HANDOFF_WARMUP: Duration = Duration::from_millis(300);
/// Contending threads in the hand-off runs.
pub(super) const HANDOFF_THREADS: [usize; 2] = [2, 8];

/// One grant: when the lock returned, when its release began, and the thread.
type Grant = (Instant, Instant, usize);

/// The grants of every thread in the order they were acquired (ties: the earlier thread's
/// first). Each thread's own grants are in that order already, as it took them one after the
/// other, so merging the runs sorts them; a sort would bring a copy of the standard library's
/// for this type alone.
fn merge_by_acquire(runs: &[Vec<Grant>]) -> Vec<Grant> {
    let total = runs.iter().map(Vec::len).sum();
    let mut next = vec![0usize; runs.len()];
    let mut merged = Vec::with_capacity(total);
    // Each turn takes one grant: at most `total` turns.
    for _ in 0..total {
        let mut first: Option<(usize, Grant)> = None;
        for (r, run) in runs.iter().enumerate() {
            if let Some(&g) = run.get(next[r]) {
                if first.is_none_or(|(_, f)| g.0 < f.0) {
                    first = Some((r, g));
                }
            }
        }
        let Some((r, g)) = first else { break };
        merged.push(g);
        next[r] += 1;
    }
    merged
}

/// Contended hand-off figures for one configuration.
pub(super) struct HandoffResult {
    pub(super) n: usize,
    pub(super) threads: usize,
    pub(super) fair: bool,
    /// From one thread starting its release to another thread's lock returning.
    pub(super) gaps: Samples,
    /// Grants that went to the thread that had just released (not counted in `gaps`).
    pub(super) regrants: usize,
    /// Grants that began before the previous one's release did: mutual exclusion broken.
    pub(super) overlaps: usize,
    pub(super) errors: u64,
}

/// `threads` threads, each with its own clone of one client (sharing its connections), loop
/// lock → hold [`HANDOFF_HOLD`] → release for [`HANDOFF_RUN`]. Every grant's acquire and
/// release instants are taken from the one monotonic clock; sorted by acquire, each grant to
/// another thread than the previous holder gives one gap: its acquire minus the previous
/// holder's release start.
pub(super) fn bench_handoff(
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
                let mut grants: Vec<Grant> = Vec::new();
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
    let mut runs = Vec::with_capacity(threads);
    let mut errors = 0;
    for w in workers {
        let (g, e) = w
            .join()
            .map_err(|_| Fail::other("a hand-off thread panicked".into()))?;
        runs.push(g);
        errors += e;
    }
    progress.show(&label, 1, 1);
    let grants = merge_by_acquire(&runs);
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

pub(super) fn print_handoff(
    out: &mut dyn Write,
    origin: &str,
    results: &mut [HandoffResult],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "contended hand-off: {origin}; each thread loops lock -> hold {} -> release for {}",
        fmt_duration(HANDOFF_HOLD),
        fmt_duration(HANDOFF_RUN)
    )?;
    writeln!(
        out,
        "gap = another thread's lock returning - the holder starting its release (first {} not counted)",
        fmt_duration(HANDOFF_WARMUP)
    )?;
    writeln!(
        out,
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
    )?;
    for h in results.iter_mut() {
        let s = h.gaps.summary();
        writeln!(
            out,
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
        )?;
    }
    Ok(())
}

/// Every configuration's figures as JSON.
pub(super) fn json(results: &mut [HandoffResult]) -> Vec<serde_json::Value> {
    results
        .iter_mut()
        .map(|h| {
            json!({
                "n": h.n,
                "threads": h.threads,
                "fair": h.fair,
                "hold_ms": HANDOFF_HOLD.as_millis() as u64,
                "gap": summary_json(h.gaps.summary()),
                "gap_histogram": histogram_json(&h.gaps),
                "regrants": h.regrants,
                "overlaps": h.overlaps,
                "errors": h.errors,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::merge_by_acquire;

    #[test]
    fn merged_grants_are_in_acquire_order_ties_by_thread() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let runs = vec![
            vec![(at(1), at(2), 0), (at(5), at(6), 0), (at(9), at(9), 0)],
            vec![],
            vec![(at(3), at(4), 2), (at(5), at(7), 2)],
            vec![(at(0), at(1), 3)],
        ];
        let merged = merge_by_acquire(&runs);
        let order: Vec<(u128, usize)> = merged
            .iter()
            .map(|g| ((g.0 - t0).as_millis(), g.2))
            .collect();
        assert_eq!(
            order,
            [(0, 3), (1, 0), (3, 2), (5, 0), (5, 2), (9, 0)],
            "merged: {order:?}"
        );
        assert!(merge_by_acquire(&[]).is_empty());
    }
}
