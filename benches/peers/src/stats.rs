//! Latency samples and their percentiles.
//!
//! The names (`Samples::{push, len, quantile}`, `ratio`, `fmt_duration`) follow the CLI's
//! statistics module, so this file can give way to it once that is shared.

use std::time::Duration;

/// Latency samples in nanoseconds.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    nanos: Vec<u64>,
    sorted: bool,
}

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.nanos.push(d.as_nanos().min(u64::MAX as u128) as u64);
        self.sorted = false;
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// The `q` quantile (`0.0..=1.0`) by the nearest-rank method; `None` when empty.
    pub fn quantile(&mut self, q: f64) -> Option<Duration> {
        if self.nanos.is_empty() {
            return None;
        }
        if !self.sorted {
            self.nanos.sort_unstable();
            self.sorted = true;
        }
        let n = self.nanos.len();
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
        Some(Duration::from_nanos(self.nanos[rank - 1]))
    }
}

/// `a / b`, or `None` when `b` is zero.
pub fn ratio(a: Duration, b: Duration) -> Option<f64> {
    (!b.is_zero()).then(|| a.as_secs_f64() / b.as_secs_f64())
}

/// A duration for a table cell: `81.2µs`, `12.41ms`, `1.203s`.
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut s = Samples::default();
        assert_eq!(s.quantile(0.5), None);
        for us in 1..=100 {
            s.push(Duration::from_micros(us));
        }
        assert_eq!(s.quantile(0.5), Some(Duration::from_micros(50)));
        assert_eq!(s.quantile(0.99), Some(Duration::from_micros(99)));
        assert_eq!(s.quantile(1.0), Some(Duration::from_micros(100)));
    }
}
