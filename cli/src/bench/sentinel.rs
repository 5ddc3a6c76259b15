//! `redlock-mux bench --sentinel`: what a member costs as a master managed by Redis Sentinel,
//! and with `?wait=1`, next to plain standalone members, on servers it starts for the run:
//! N plain servers; N masters each with a replica, named directly with `?wait=1`; N Sentinel
//! members (a master, a replica and three sentinels each, as the tests start them). The three
//! clients run the mutex in rotating blocks; the figures are acquire and cycle p50 and p99, and
//! their ratios to the plain members.

use std::io::{self, Write};

use redlock_mux::resp::Value;
use redlock_mux::Client;
use redlock_mux_kit::probe::{cmd, eventually};
use redlock_mux_kit::sentinel::SentinelMember;
use serde_json::json;

use super::phases::{
    ours_cycles, phases_json, print_detail_header, print_detail_rows, Kind, Phases,
};
use super::{Progress, BLOCK};
use crate::local_servers::RedisServer;
use crate::stats::{fmt_duration, ratio, Fixed};
use crate::Fail;

/// The variants measured, in the order of the rows: the plain members first (the baseline).
const VARIANTS: [&str; 3] = ["plain", "sentinel", "wait=1"];

/// A master and its replica, linked.
fn master_with_replica() -> Result<(RedisServer, RedisServer), Fail> {
    let start = |args: &[&str]| {
        RedisServer::start_with(args)
            .map_err(|e| Fail::other(format!("could not start redis-server: {e}")))
    };
    let master = start(&["--repl-diskless-sync-delay", "0"])?;
    let port = master.port().to_string();
    let replica = start(&["--replicaof", "127.0.0.1", &port])?;
    let linked = || {
        matches!(cmd(master.addr(), &[b"INFO", b"replication"]),
            Value::Bulk(Some(t)) if String::from_utf8_lossy(&t).contains("state=online"))
    };
    if !eventually(std::time::Duration::from_secs(10), linked) {
        return Err(Fail::other(format!(
            "the replica of {} did not link",
            master.addr()
        )));
    }
    Ok((master, replica))
}

/// Starts `n` members of each kind (the default server binary: $REDLOCK_MUX_REDIS_SERVER, else
/// redis-server on PATH) and measures `iters` cycles per variant.
pub fn run(n: usize, iters: usize, json: bool, progress: &Progress) -> Result<i32, Fail> {
    if !json {
        eprintln!(
            "starting {n} plain servers, {n} masters with a replica, and {n} Sentinel members \
             (a master, a replica, three sentinels each)..."
        );
    }
    let plain: Vec<RedisServer> = (0..n)
        .map(|_| RedisServer::start())
        .collect::<Result<_, _>>()
        .map_err(|e| Fail::other(format!("could not start redis-server: {e}")))?;
    let pairs: Vec<(RedisServer, RedisServer)> = (0..n)
        .map(|_| master_with_replica())
        .collect::<Result<_, _>>()?;
    let members: Vec<SentinelMember> = (0..n)
        .map(|_| SentinelMember::start(None))
        .collect::<Result<_, _>>()
        .map_err(|e| Fail::other(format!("could not start a Sentinel member: {e}")))?;
    let name = super::server_name(&plain[0].url());
    let origin = format!("{n} members of each kind, local {name} instances");
    let urls: [Vec<String>; 3] = [
        plain.iter().map(RedisServer::url).collect(),
        members.iter().map(|m| m.url("")).collect(),
        pairs
            .iter()
            .map(|(m, _)| format!("{}?wait=1", m.url()))
            .collect(),
    ];
    let clients = urls
        .iter()
        .map(|u| {
            Client::builder()
                .nodes(u)
                .build()
                .map_err(|e| Fail::other(format!("bad nodes: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let keys: Vec<String> = VARIANTS
        .iter()
        .map(|v| format!("redlock-mux:bench:{v}:{n}"))
        .collect();
    let mut rows: Vec<Phases> = VARIANTS
        .iter()
        .map(|_| Phases::with_capacity(iters))
        .collect();
    let mut scratch = Phases::default();
    let warmup = (iters / 10).clamp(100, 2000);
    for (c, k) in clients.iter().zip(&keys) {
        ours_cycles(c, Kind::Mutex, k, warmup, &mut scratch);
    }
    let (mut done, mut block) = (0, 0usize);
    while done < iters {
        let count = BLOCK.min(iters - done);
        // Rotating order: each variant goes first, second and last alike.
        for j in 0..VARIANTS.len() {
            let v = (block + j) % VARIANTS.len();
            ours_cycles(&clients[v], Kind::Mutex, &keys[v], count, &mut rows[v]);
        }
        done += count;
        block += 1;
        progress.show("sentinel", done, iters);
    }
    progress.clear();
    let mut out = io::stdout().lock();
    if json {
        // Inserted one by one: collecting into the map (a BTreeMap) would sort the pairs first,
        // with a copy of the standard library's stable sort for them alone.
        let mut variants = serde_json::Map::new();
        for (v, p) in VARIANTS.iter().zip(rows.iter_mut()) {
            variants.insert(v.to_string(), phases_json(p));
        }
        writeln!(
            out,
            "{}",
            json!({ "origin": origin, "n": n, "iters": iters, "sentinel": variants })
        )?;
    } else {
        print(&mut out, &origin, n, iters, &mut rows)?;
    }
    out.flush()?;
    Ok(0)
}

fn print(
    out: &mut dyn Write,
    origin: &str,
    n: usize,
    iters: usize,
    rows: &mut [Phases],
) -> io::Result<()> {
    writeln!(
        out,
        "Sentinel members and ?wait=1 next to plain members: {origin}; {iters} cycles per \
         variant, in rotating blocks of {BLOCK}"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<9} {:<8} {:>10} {:>7}   {:>10} {:>7}",
        "members", "op", "p50", "ratio", "p99", "ratio"
    )?;
    let (base, others) = rows.split_at_mut(1);
    let base = &mut base[0];
    let (b_a50, b_a99) = (base.acquire.quantile(0.5), base.acquire.quantile(0.99));
    let (b_c50, b_c99) = (base.cycle.quantile(0.5), base.cycle.quantile(0.99));
    let line = |out: &mut dyn Write, v: &str, p: &mut Phases| -> io::Result<()> {
        for (op, s, b50, b99) in [
            ("acquire", &mut p.acquire, b_a50, b_a99),
            ("cycle", &mut p.cycle, b_c50, b_c99),
        ] {
            let (q50, q99) = (s.quantile(0.5), s.quantile(0.99));
            writeln!(
                out,
                "{:<9} {:<8} {:>10} {:>6.3}x   {:>10} {:>6.3}x",
                v,
                op,
                fmt_duration(q50),
                Fixed(ratio(q50, b50)),
                fmt_duration(q99),
                Fixed(ratio(q99, b99)),
            )?;
        }
        Ok(())
    };
    line(out, VARIANTS[0], base)?;
    for (v, p) in VARIANTS[1..].iter().zip(others.iter_mut()) {
        line(out, v, p)?;
    }
    writeln!(out)?;
    print_detail_header(out, "members")?;
    for (v, p) in VARIANTS.iter().zip(rows.iter_mut()) {
        print_detail_rows(out, n, v, p)?;
    }
    Ok(())
}
