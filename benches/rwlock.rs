//! Read and write acquire latency against the mutex, at N = 5, in the same run.
//!
//! Five local redis-server processes; one client; the three kinds are measured in interleaved
//! blocks so that drift of the machine's load affects each alike. Each sample is one try
//! acquire (no retry: the key is always free) and, timed apart, its release. Prints p50 and
//! p99 per kind and their ratios to the mutex. Runs for about 30 s; `RWLOCK_BENCH_SECS`
//! changes that.

use redlock_mux_kit::local_servers;

use std::time::{Duration, Instant};

use local_servers::RedisCluster;
use redlock_mux::Client;

const NODES: usize = 5;
const BLOCK: usize = 200;
const TTL: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Samples {
    acquire: Vec<Duration>,
    total: Vec<Duration>,
    failed: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let secs: u64 = std::env::var("RWLOCK_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        // `cargo test --all-targets` runs this without `--bench`: a one-second smoke run then.
        .unwrap_or(if std::env::args().any(|a| a == "--bench") {
            30
        } else {
            1
        });
    let cluster = RedisCluster::start(NODES).expect("start redis-server");
    let client = Client::builder()
        .nodes(cluster.urls())
        .build()
        .expect("client");
    let kinds = ["mutex", "read", "write"];
    let mut samples: [Samples; 3] = Default::default();
    // A node slower than the node timeout (a loaded machine) can leave a hold behind on it
    // for the next attempt to trip over: such samples are counted, not timed.
    let run = |kind: usize, s: &mut Samples| {
        let t = Instant::now();
        let acquired = match kind {
            0 => client
                .try_lock("bench", TTL)
                .map(|l| (t.elapsed(), l.release())),
            1 => client
                .try_read_lock("bench", TTL)
                .map(|l| (t.elapsed(), l.release())),
            _ => client
                .try_write_lock("bench", TTL)
                .map(|l| (t.elapsed(), l.release())),
        };
        match acquired {
            Ok((acquire, Ok(()))) => {
                s.acquire.push(acquire);
                s.total.push(t.elapsed());
            }
            _ => s.failed += 1,
        }
    };
    // Warm-up: connections, script cache.
    for (kind, s) in samples.iter_mut().enumerate() {
        for _ in 0..BLOCK {
            run(kind, s);
        }
        *s = Samples::default();
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let mut blocks = 0;
    while Instant::now() < end {
        // Rotate the order too, so no kind always runs right after another.
        for i in 0..3 {
            let kind = (i + blocks) % 3;
            for _ in 0..BLOCK {
                run(kind, &mut samples[kind]);
            }
        }
        blocks += 1;
    }
    println!("rwlock bench: N = {NODES}, {blocks} rounds of {BLOCK}-sample blocks per kind");
    let mut base = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    for (kind, s) in samples.iter_mut().enumerate() {
        s.acquire.sort();
        s.total.sort();
        let (a50, a99) = (percentile(&s.acquire, 0.5), percentile(&s.acquire, 0.99));
        let (t50, t99) = (percentile(&s.total, 0.5), percentile(&s.total, 0.99));
        if kind == 0 {
            base = (a50, a99, t50, t99);
        }
        let r = |x: Duration, b: Duration| x.as_secs_f64() / b.as_secs_f64();
        println!(
            "{:>5}: acquire p50 {:>9.1?} p99 {:>9.1?} ({:.2}x, {:.2}x mutex) | acquire+release p50 {:>9.1?} p99 {:>9.1?} ({:.2}x, {:.2}x mutex)  n={} failed={}",
            kinds[kind],
            a50,
            a99,
            r(a50, base.0),
            r(a99, base.1),
            t50,
            t99,
            r(t50, base.2),
            r(t99, base.3),
            s.total.len(),
            s.failed,
        );
    }
}
