//! Latency statistics: percentiles, a summary and a log-scale text histogram.
//!
//! Std only; `redlock-mux bench` and the peer benchmark (`benches/peers`) report the same
//! figures the same way through it.

use std::fmt::Write as _;
use std::time::Duration;

/// Latency samples in nanoseconds.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    nanos: Vec<u64>,
    sorted: bool,
}

impl Samples {
    /// Empty, with room for `n` samples.
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            nanos: Vec::with_capacity(n),
            sorted: true,
        }
    }

    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.nanos.push(d.as_nanos().min(u64::MAX as u128) as u64);
        self.sorted = false;
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: &Samples) {
        self.nanos.extend_from_slice(&other.nanos);
        self.sorted = false;
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nanos.is_empty()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.nanos.sort_unstable();
            self.sorted = true;
        }
    }

    /// The `q` quantile (`0.0..=1.0`) by the nearest-rank method; zero when empty.
    pub fn quantile(&mut self, q: f64) -> Duration {
        self.sort();
        if self.nanos.is_empty() {
            return Duration::ZERO;
        }
        let n = self.nanos.len();
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
        Duration::from_nanos(self.nanos[rank - 1])
    }

    /// The usual figures of a latency distribution.
    pub fn summary(&mut self) -> Summary {
        let total: u128 = self.nanos.iter().map(|&n| n as u128).sum();
        let mean = if self.nanos.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_nanos((total / self.nanos.len() as u128) as u64)
        };
        Summary {
            count: self.nanos.len(),
            mean,
            p50: self.quantile(0.50),
            p90: self.quantile(0.90),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: self.quantile(1.0),
        }
    }

    /// A histogram with four buckets per power of two of nanoseconds, from the smallest
    /// sample's bucket to the largest's.
    pub fn histogram(&self) -> Histogram {
        let mut counts = std::collections::BTreeMap::new();
        for &n in &self.nanos {
            *counts.entry(bucket_of(n)).or_insert(0u64) += 1;
        }
        let (lo, hi) = match (counts.keys().next(), counts.keys().next_back()) {
            (Some(&lo), Some(&hi)) => (lo, hi),
            _ => return Histogram { rows: Vec::new() },
        };
        let rows = (lo..=hi)
            .map(|b| HistogramRow {
                low: bucket_low(b),
                high: bucket_low(b + 1),
                count: counts.get(&b).copied().unwrap_or(0),
            })
            .collect();
        Histogram { rows }
    }
}

/// Sub-buckets per power of two: bucket bounds grow by about 19% each.
const SUB_BUCKETS: u32 = 4;

fn bucket_of(nanos: u64) -> u32 {
    // Below 4 ns the quarter-steps would not be whole nanoseconds; no latency is that short.
    let n = nanos.max(4);
    let exp = 63 - n.leading_zeros();
    // The two bits after the leading one pick the sub-bucket.
    let sub = ((n >> (exp - 2)) & 3) as u32;
    exp * SUB_BUCKETS + sub
}

fn bucket_low(bucket: u32) -> Duration {
    let exp = bucket / SUB_BUCKETS;
    let sub = (bucket % SUB_BUCKETS) as u64;
    let base = 1u128 << exp;
    let low = base + base * sub as u128 / SUB_BUCKETS as u128;
    Duration::from_nanos(low.min(u64::MAX as u128) as u64)
}

/// Percentiles and extremes of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Largest sample.
    pub max: Duration,
}

impl Summary {
    /// Operations per second one thread achieves at this mean latency.
    pub fn ops_per_sec(&self) -> f64 {
        let secs = self.mean.as_secs_f64();
        if secs > 0.0 {
            1.0 / secs
        } else {
            0.0
        }
    }
}

/// A duration in microseconds, as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `a / b` as a ratio, NaN-free: 0 when `b` is zero.
pub fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// A duration for a table cell: `812.3µs`, `12.41ms`, `1.203s`.
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", Fixed(ns as f64 / 1e3))
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", Fixed(ns as f64 / 1e6))
    } else {
        format!("{:.3}s", Fixed(ns as f64 / 1e9))
    }
}

/// A figure written with as many decimals as the format's precision asks for (`{:.3}`: three,
/// up to 18; none: none), rounded to the nearest (ties to even), and right-aligned in a width as
/// numbers are: `format!("{:>7.2}", Fixed(x))` writes what `format!("{x:>7.2}")` does (exactly
/// up to 2^52 units of the last place; beyond, from the product as rounded). It stands in for
/// the standard library's formatting of floats, about 14 KB of the small static command. A
/// figure beyond what a `u128` holds at that precision (no latency, rate or ratio comes near)
/// is written as `inf`.
#[derive(Debug, Clone, Copy)]
pub struct Fixed(pub f64);

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let x = self.0;
        if x.is_nan() {
            return f.pad_integral(true, "", "NaN");
        }
        let places = f.precision().unwrap_or(0).min(18);
        let (a, scale) = (x.abs(), 10u64.pow(places as u32) as f64);
        let mut scaled = (a * scale).floor();
        if scaled < (1u64 << 52) as f64 {
            // Rounded as the exact value of `x` is: the sign of a fused multiply-add is exact
            // (and so is `2 * scale`, a power of ten up to 10^18 doubled): below `scaled` by
            // a rounding of the product, and above, at, or below the midpoint of `scaled` and
            // the next figure.
            if a.mul_add(scale, -scaled) < 0.0 {
                scaled -= 1.0;
            }
            let above_half = a.mul_add(2.0 * scale, -(2.0 * scaled + 1.0));
            if above_half > 0.0 || (above_half == 0.0 && scaled as u64 % 2 == 1) {
                scaled += 1.0;
            }
        } else {
            scaled = (a * scale).round_ties_even();
        }
        // At most 39 digits and the point.
        let mut buf = [0u8; 48];
        let mut at = buf.len();
        if scaled < u128::MAX as f64 {
            let mut n = scaled as u128;
            let mut digits = 0;
            while digits <= places || n > 0 {
                if digits == places && places > 0 {
                    at -= 1;
                    buf[at] = b'.';
                }
                at -= 1;
                buf[at] = b'0' + (n % 10) as u8;
                n /= 10;
                digits += 1;
            }
        } else {
            at -= 3;
            buf[at..].copy_from_slice(b"inf");
        }
        let text = std::str::from_utf8(&buf[at..]).map_err(|_| std::fmt::Error)?;
        f.pad_integral(x.is_sign_positive(), "", text)
    }
}

/// A failure message without what differs from one call to the next, so that alike failures
/// count together: `unreachable: 3 failed (node 0 (127.0.0.1:6379): timed out; node 2 (…):
/// timed out)` becomes `unreachable: 3 failed (timed out)`, the distinct reasons of the
/// parenthesis after the first `" ("`.
pub fn failure_kind(message: &str) -> String {
    let (Some(open), Some(close)) = (message.find(" ("), message.rfind(')')) else {
        return message.to_owned();
    };
    if close < open {
        return message.to_owned();
    }
    let mut reasons: Vec<&str> = Vec::new();
    for part in message[open + 2..close].split("; ") {
        let reason = part.rsplit(": ").next().unwrap_or(part).trim();
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    format!(
        "{} ({}){}",
        &message[..open],
        reasons.join(", "),
        &message[close + 1..]
    )
}

/// One bucket of a [`Histogram`]: samples in `[low, high)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramRow {
    /// Inclusive lower bound.
    pub low: Duration,
    /// Exclusive upper bound.
    pub high: Duration,
    /// Samples in the bucket.
    pub count: u64,
}

/// Log-scale buckets, from the lowest non-empty one to the highest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// The buckets, in increasing order of latency.
    pub rows: Vec<HistogramRow>,
}

impl Histogram {
    /// A text rendering at most `max_rows` lines long (neighbouring buckets are merged to fit),
    /// with bars up to `width` characters.
    pub fn render(&self, max_rows: usize, width: usize) -> String {
        let rows = self.merged(max_rows.max(1));
        let total: u64 = rows.iter().map(|r| r.count).sum();
        let peak = rows.iter().map(|r| r.count).max().unwrap_or(0).max(1);
        let mut out = String::new();
        for r in &rows {
            let bar = (r.count as u128 * width as u128).div_ceil(peak as u128) as usize;
            let pct = if total > 0 {
                100.0 * r.count as f64 / total as f64
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "  {:>9} .. {:>9} {:>8} {:>5.1}% {}",
                fmt_duration(r.low),
                fmt_duration(r.high),
                r.count,
                Fixed(pct),
                "#".repeat(bar)
            );
        }
        out
    }

    fn merged(&self, max_rows: usize) -> Vec<HistogramRow> {
        let per = self.rows.len().div_ceil(max_rows).max(1);
        self.rows
            .chunks(per)
            .map(|c| HistogramRow {
                low: c[0].low,
                high: c[c.len() - 1].high,
                count: c.iter().map(|r| r.count).sum(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_writes_what_the_float_formatting_writes() {
        let cases = [
            0.0, -0.0, 1.0, 0.5, 1.5, 2.5, 1.25, 0.125, 0.04, -0.04, 1.2345, 12.41, 812.3, 999.95,
            9.9996, 123456.789, 1e15, 3.0e-7, -2.675, 0.1, 0.7, 35000.4,
        ];
        for x in cases {
            for (got, want) in [
                (format!("{:.0}", Fixed(x)), format!("{x:.0}")),
                (format!("{:.1}", Fixed(x)), format!("{x:.1}")),
                (format!("{:.2}", Fixed(x)), format!("{x:.2}")),
                (format!("{:.3}", Fixed(x)), format!("{x:.3}")),
                (format!("{:>6.3}x", Fixed(x)), format!("{x:>6.3}x")),
                (format!("{:>10.0}", Fixed(x)), format!("{x:>10.0}")),
                (format!("{:<8.1}|", Fixed(x)), format!("{x:<8.1}|")),
                (format!("{:08.2}", Fixed(x)), format!("{x:08.2}")),
            ] {
                assert_eq!(got, want, "{x:?}");
            }
        }
        // Ratios and rates as the bench computes them.
        for a in 1..400u32 {
            let x = f64::from(a) / 7.0;
            assert_eq!(format!("{:.3}", Fixed(x)), format!("{x:.3}"), "{x:?}");
            assert_eq!(format!("{:.1}", Fixed(x)), format!("{x:.1}"), "{x:?}");
        }
        for (x, want) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(format!("{:.2}", Fixed(x)), want);
            assert_eq!(format!("{x:.2}"), want);
        }
        // Figures of every size, and ties and near-ties of each precision.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..20_000u32 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let x = match i % 3 {
                0 => f64::from_bits(0x3c00_0000_0000_0000 | (state >> 12) & 0x07ff_ffff_ffff_ffff),
                1 => (state >> 40) as f64 / 1000.0 + 0.0005,
                _ => (state >> 44) as f64 / 8.0,
            };
            for places in 0..5 {
                assert_eq!(
                    format!("{:.*}", places, Fixed(x)),
                    format!("{x:.places$}"),
                    "{x:?} to {places}"
                );
            }
        }
        assert_eq!(format!("{}", Fixed(2.6)), "3", "no precision: no decimals");
        assert_eq!(format!("{:.1}", Fixed(1e300)), "inf", "beyond a u128");
    }

    #[test]
    fn durations_for_table_cells() {
        for (d, want) in [
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_nanos(1_000), "1.0µs"),
            (Duration::from_nanos(812_340), "812.3µs"),
            (Duration::from_nanos(999_960), "1000.0µs"),
            (Duration::from_nanos(12_414_000), "12.41ms"),
            (Duration::from_nanos(1_203_400_000), "1.203s"),
        ] {
            assert_eq!(fmt_duration(d), want);
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut s = Samples::with_capacity(100);
        assert_eq!(s.quantile(0.5), Duration::ZERO, "no samples, no latency");
        for i in 1..=100 {
            s.push(Duration::from_micros(i));
        }
        assert_eq!(s.quantile(0.5), Duration::from_micros(50));
        assert_eq!(s.quantile(0.99), Duration::from_micros(99));
        assert_eq!(s.quantile(1.0), Duration::from_micros(100));
        let sum = s.summary();
        assert_eq!(sum.p50, Duration::from_micros(50));
        assert_eq!(sum.p99, Duration::from_micros(99));
        assert_eq!(sum.max, Duration::from_micros(100));
        assert_eq!(sum.count, 100);
    }

    #[test]
    fn failures_of_one_kind_read_alike() {
        let a = "release: quorum of 3 out of 5 nodes unreachable: 3 failed (node 0 (127.0.0.1:36463): timed out; node 2 (127.0.0.1:43949): timed out; node 3 (127.0.0.1:44911): io error)";
        assert_eq!(
            failure_kind(a),
            "release: quorum of 3 out of 5 nodes unreachable: 3 failed (timed out, io error)"
        );
        assert_eq!(failure_kind("no quorum"), "no quorum");
        assert_eq!(failure_kind("odd ) (text"), "odd ) (text");
    }

    #[test]
    fn histogram_counts_every_sample_once() {
        let mut s = Samples::default();
        for i in 0..1000u64 {
            s.push(Duration::from_nanos(1 + i * i * 37));
        }
        let h = s.histogram();
        assert_eq!(h.rows.iter().map(|r| r.count).sum::<u64>(), 1000);
        for w in h.rows.windows(2) {
            assert_eq!(w[0].high, w[1].low);
        }
        for r in &h.rows {
            assert!(r.low < r.high);
        }
        let text = h.render(8, 20);
        assert!(text.lines().count() <= 8);
    }
}
