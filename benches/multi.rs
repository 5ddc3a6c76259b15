//! Latency of all-or-none sets and fenced locks next to the plain mutex, at N = 5 local
//! redis-server processes, measured in one run with the kinds interleaved in blocks so that
//! drift in the machine's load affects them alike. Prints p50/p99 and ratios to the mutex.
//!
//! `cargo bench --bench multi [-- BLOCKS [PER_BLOCK]]`

use redlock_mux_kit::local_servers;

use std::time::{Duration, Instant};

use local_servers::RedisCluster;
use redlock_mux::{Client, Error};

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Kind {
    Mutex,
    LockAll(usize),
    Fenced,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Mutex => "mutex".into(),
            Kind::LockAll(n) => format!("lock_all {n} key{}", if n == 1 { "" } else { "s" }),
            Kind::Fenced => "lock_fenced".into(),
        }
    }

    /// Acquires once on fresh keys (a node that timed out may keep a stale key), returns how
    /// long the acquisition took, then releases.
    fn run(self, client: &Client, i: u64) -> Result<Duration, Error> {
        match self {
            Kind::Mutex => {
                let start = Instant::now();
                let lock = client.try_lock(format!("m:{i}"), TTL)?;
                let took = start.elapsed();
                let _ = lock.release();
                Ok(took)
            }
            Kind::LockAll(n) => {
                let keys: Vec<String> = (0..n).map(|k| format!("s:{i}:{k}")).collect();
                let start = Instant::now();
                let lock = client.try_lock_all(&keys, TTL)?;
                let took = start.elapsed();
                let _ = lock.release();
                Ok(took)
            }
            Kind::Fenced => {
                let start = Instant::now();
                let lock = client.try_lock_fenced(format!("f:{i}"), TTL)?;
                let took = start.elapsed();
                let _ = lock.release();
                Ok(took)
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    // `cargo test --all-targets` runs this without `--bench`: a small smoke run then.
    let full = std::env::args().any(|a| a == "--bench");
    let blocks = args.first().copied().unwrap_or(if full { 30 } else { 2 });
    let per_block = args.get(1).copied().unwrap_or(if full { 100 } else { 10 });
    let cluster = RedisCluster::start(NODES).expect("redis-server");
    let client = Client::new(cluster.urls()).expect("client");
    let kinds = [
        Kind::Mutex,
        Kind::LockAll(1),
        Kind::LockAll(4),
        Kind::LockAll(16),
        Kind::Fenced,
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut failed = vec![0usize; kinds.len()];
    let mut i = 0u64;
    // Warm up connections and script caches.
    for kind in kinds {
        for _ in 0..50 {
            i += 1;
            let _ = kind.run(&client, i);
        }
    }
    for _ in 0..blocks {
        for (k, kind) in kinds.iter().enumerate() {
            for _ in 0..per_block {
                i += 1;
                match kind.run(&client, i) {
                    Ok(took) => samples[k].push(took),
                    Err(_) => failed[k] += 1,
                }
            }
        }
    }
    samples.iter_mut().for_each(|s| s.sort_unstable());
    let (base50, base99) = (percentile(&samples[0], 0.5), percentile(&samples[0], 0.99));
    println!(
        "N = {NODES}, {blocks} blocks x {per_block} per kind, acquisition latency (release not timed)"
    );
    println!(
        "{:<16} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "kind", "p50 us", "p99 us", "p50 x", "p99 x", "failed"
    );
    for ((kind, s), failed) in kinds.iter().zip(&samples).zip(&failed) {
        let (p50, p99) = (percentile(s, 0.5), percentile(s, 0.99));
        println!(
            "{:<16} {:>10.1} {:>10.1} {:>8.2} {:>8.2} {:>7}",
            kind.name(),
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            p50.as_secs_f64() / base50.as_secs_f64(),
            p99.as_secs_f64() / base99.as_secs_f64(),
            failed,
        );
    }
    let fenced = percentile(&samples[kinds.len() - 1], 0.5);
    let ratio = fenced.as_secs_f64() / base50.as_secs_f64();
    println!(
        "lock_fenced p50 / mutex p50 = {ratio:.2} (target <= 2.00: {})",
        if ratio <= 2.0 { "met" } else { "missed" }
    );
}
