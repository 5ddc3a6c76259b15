//! A small timing loop for the micro-benchmarks, std only (no benchmark framework, to keep the
//! main build light).
//!
//! Under `cargo bench` (which passes `--bench`) each routine is calibrated to about 20 ms per
//! sample and sampled 15 times; the median and the fastest sample are printed, per operation
//! and, when a byte count is given, as throughput. Under `cargo test --all-targets` each routine
//! runs a few times only, as a smoke test.

use std::time::{Duration, Instant};

/// Whether this run is a measurement (`cargo bench`) rather than a smoke test.
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Prints the table header.
pub fn header(title: &str) {
    if measuring() {
        println!("\n{title}");
        println!(
            "{:<44} {:>12} {:>12} {:>12}",
            "routine", "median", "fastest", "throughput"
        );
    }
}

/// Times `f`, which processes `bytes` bytes per call (0: not a throughput figure).
pub fn bench(name: &str, bytes: usize, mut f: impl FnMut()) {
    if !measuring() {
        for _ in 0..3 {
            f();
        }
        return;
    }
    const SAMPLE: Duration = Duration::from_millis(20);
    let mut iters: u64 = 1;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() >= SAMPLE || iters >= 1 << 30 {
            break;
        }
        iters *= 2;
    }
    let mut per_op: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() * 1e9 / iters as f64
        })
        .collect();
    per_op.sort_by(f64::total_cmp);
    let (median, fastest) = (per_op[per_op.len() / 2], per_op[0]);
    let throughput = if bytes == 0 {
        String::new()
    } else {
        format!("{:.0} MB/s", bytes as f64 / median * 1e3)
    };
    println!(
        "{name:<44} {:>12} {:>12} {throughput:>12}",
        format!("{median:.1} ns"),
        format!("{fastest:.1} ns")
    );
}
