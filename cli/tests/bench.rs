//! `redlock-mux bench` against real redis-server processes it is given.

mod support;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use support::*;

/// `bench ARGS --json`, parsed; fails the test unless it succeeded.
fn bench_json(cluster: &RedisCluster, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--iters", "200", "--json"];
    all.extend_from_slice(args);
    let out = output(cluster, &all);
    assert!(out.status.success(), "{}", both(&out));
    // Stderr is not a terminal here: no progress bar.
    assert!(!out.stderr.contains(&b'\r'), "{}", both(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", both(&out)))
}

/// A summary with every percentile, as microseconds.
fn assert_summary(s: &serde_json::Value, count: u64) {
    assert_eq!(s["count"], count, "{s}");
    for figure in ["mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"] {
        assert!(
            s[figure].as_f64().is_some_and(|us| us > 0.0),
            "{figure}: {s}"
        );
    }
}

#[test]
fn bench_reports_json_against_given_nodes() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    let urls = nodes(&cluster);
    let report = bench_json(&cluster, &["--nodes", &urls]);
    assert_eq!(report["nodes"], "1 nodes from --nodes");
    assert_eq!(report["iters"], 200);
    let mutex = &report["mutex"][0];
    assert_eq!(mutex["n"], 1);
    for client in ["ours", "baseline"] {
        let figures = &mutex[client];
        assert_eq!(figures["errors"], 0, "{client}: {figures}");
        for phase in ["acquire", "release", "cycle"] {
            assert_summary(&figures[phase], 200);
        }
        assert!(figures["ops_per_sec"].as_f64().unwrap() > 0.0);
        let buckets = figures["cycle_histogram"].as_array().expect("histogram");
        let counted: u64 = buckets.iter().map(|b| b[2].as_u64().unwrap()).sum();
        assert_eq!(counted, 200);
    }
    for q in ["ratio_p50", "ratio_p99"] {
        assert!(mutex[q]["cycle"].as_f64().unwrap() > 0.0, "{mutex}");
    }
    // The library's statistics of the measured client: every cycle's round was won.
    let stats = &mutex["stats"];
    assert!(
        stats["rounds"]["mutex"]["won"].as_u64().unwrap() >= 200,
        "{stats}"
    );
    assert!(stats["nodes"][0]["latency_p50_us"].is_u64(), "{stats}");
    assert_eq!(stats["nodes"][0]["failures"]["timeout"], 0, "{stats}");

    // REDLOCK_NODES names the servers when --nodes does not.
    let report = bench_json(&cluster, &["--mode", "read"]);
    assert_eq!(report["nodes"], "1 nodes from REDLOCK_NODES");
    let rw = &report["rw"][0];
    assert_eq!(rw["n"], 1);
    assert_eq!(rw["read"]["figures"]["errors"], 0, "{rw}");
    assert_eq!(rw["mutex"]["errors"], 0, "{rw}");
    assert_summary(&rw["read"]["figures"]["cycle"], 200);
    assert!(rw["read"]["ratio_to_mutex_p50"]["cycle"].as_f64().unwrap() > 0.0);
    // Next to rawQ-rw, the ideal client of the seed's scripts, for reads and for writes.
    let write = bench_json(&cluster, &["--mode", "write"]);
    for (report, kind) in [(&report, "read"), (&write, "write")] {
        let fig = &report["rw"][0][kind];
        assert_eq!(fig["rawq_rw"]["errors"], 0, "{kind}: {fig}");
        assert_summary(&fig["rawq_rw"]["acquire"], 200);
        assert_summary(&fig["rawq_rw"]["cycle"], 200);
        assert!(
            fig["ratio_to_rawq_rw_p50"]["acquire"].as_f64().unwrap() > 0.0,
            "{kind}: {fig}"
        );
    }
}

#[test]
fn bench_measures_the_semaphore_next_to_the_mutex() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let report = bench_json(&cluster, &["--mode", "semaphore"]);
    let runs = report["rw"].as_array().expect("rw");
    // N = 1 and 3.
    assert_eq!(runs.len(), 2, "{report}");
    for rw in runs {
        let sem = &rw["semaphore"];
        assert_eq!(sem["figures"]["errors"], 0, "{rw}");
        assert_eq!(rw["mutex"]["errors"], 0, "{rw}");
        assert_summary(&sem["figures"]["acquire"], 200);
        assert!(sem["ratio_to_mutex_p50"]["acquire"].as_f64().unwrap() > 0.0);
        // rawQ-rw is for read and write locks only.
        assert!(sem.get("rawq_rw").is_none(), "{rw}");
    }
    // Read and write locks are measured at the largest N only, next to rawQ-rw.
    let report = bench_json(&cluster, &["--mode", "read"]);
    let runs = report["rw"].as_array().expect("rw");
    assert_eq!(runs.len(), 1, "{report}");
    assert_eq!(runs[0]["n"], 3, "{report}");
    assert_summary(&runs[0]["read"]["rawq_rw"]["acquire"], 200);
}

#[test]
fn bench_scales_over_threads_on_distinct_keys() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let report = bench_json(
        &cluster,
        &["--threads", "1,4", "--duration", "300ms", "--rounds", "2"],
    );
    assert_eq!(report["scale"]["rounds"], 2, "{report}");
    assert_eq!(report["scale"]["cell_s"], 0.3, "{report}");
    assert!(
        report["scale"]["ours_top_to_t1_ops"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let runs = report["threads"].as_array().expect("threads");
    assert_eq!(runs.len(), 2, "{report}");
    for (run, threads) in runs.iter().zip([1u64, 4]) {
        assert_eq!(run["threads"], threads);
        assert_eq!(run["n"], 3);
        assert!(run["ratio_ops_ours_to_raw_n"].as_f64().unwrap() > 0.0);
        for who in ["ours", "raw_n"] {
            let f = &run[who];
            // A loaded machine may time a node out (the bench keeps the default 50 ms node
            // timeout); anything else is a failure of the bench or the library.
            let reasons = f["failure_reasons"].as_object().expect("reasons");
            assert!(
                reasons.keys().all(|why| why.contains("timed out")),
                "{who}: {f}"
            );
            let counted: u64 = reasons.values().map(|n| n.as_u64().unwrap()).sum();
            assert_eq!(f["failures"], counted, "{who}: {f}");
            let cycles = f["cycles"].as_u64().unwrap();
            assert!(cycles >= 10, "{who}: {f}");
            assert_summary(&f["cycle"], cycles);
            assert_summary(&f["acquire"], cycles);
            assert_eq!(f["ops_per_sec_rounds"].as_array().unwrap().len(), 2);
            assert!(f["ops_per_sec"].as_f64().unwrap() > 0.0, "{who}: {f}");
            // The servers did some work for every cycle.
            assert!(
                f["server_cpu_us_per_cycle"].as_f64().unwrap() > 0.0,
                "{who}: {f}"
            );
            let conns = f["connections_per_node"].as_u64().unwrap();
            assert!((1..=threads).contains(&conns), "{who}: {f}");
        }
        // The baseline has one connection per thread on each node, the probe not counted, and
        // no subscriber; nothing here waits, so ours has none either.
        assert_eq!(run["raw_n"]["connections_per_node"], threads, "{run}");
        assert_eq!(run["raw_n"]["subscriber_connections_per_node"], 0, "{run}");
        assert_eq!(run["ours"]["subscriber_connections_per_node"], 0, "{run}");
    }
    // Nothing else was measured.
    assert_eq!(report["mutex"], serde_json::json!([]));

    // The text form has a row per thread count and client.
    let out = output(
        &cluster,
        &[
            "bench",
            "--threads",
            "2,3",
            "--duration",
            "0.2",
            "--rounds",
            "1",
        ],
    );
    assert!(out.status.success(), "{}", both(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ops/s"), "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 12 && w[0] == "3" && (w[1] == "2" || w[1] == "3"))
        .collect();
    assert_eq!(
        rows.len(),
        4,
        "N, threads, client, ops/s, acq p50, acq p99, cyc p50, cyc p99, failed, conns/node, subs, cpu/cycle:\n{text}"
    );
    for row in &rows {
        assert!(row[2] == "ours" || row[2] == "rawN", "{text}");
        assert_eq!(row[8], "0", "no failed call:\n{text}");
    }
    // No T = 1 measured, so no ratio to it.
    assert!(!text.contains("÷ ours at T=1"), "{text}");
    // Bad values are usage errors.
    for bad in [
        &["bench", "--threads", "0"][..],
        &["bench", "--threads", "1", "--duration", "0"],
        &["bench", "--threads", "1", "--rounds", "0"],
    ] {
        assert_eq!(output(&cluster, bad).status.code(), Some(64), "{bad:?}");
    }
}

/// A one-master Redis Cluster: a server with `--cluster-enabled yes` that serves every slot.
fn one_master_cluster() -> RedisServer {
    let server = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ])
    .expect("start redis-server");
    cmd(
        server.addr(),
        &[b"CLUSTER", b"ADDSLOTSRANGE", b"0", b"16383"],
    );
    let ok = eventually(Duration::from_secs(10), || {
        matches!(cmd(server.addr(), &[b"CLUSTER", b"INFO"]),
            redlock_mux::resp::Value::Bulk(Some(info))
                if String::from_utf8_lossy(&info).contains("cluster_state:ok"))
    });
    assert!(ok, "the cluster did not reach cluster_state:ok");
    server
}

#[test]
fn bench_threads_measures_cluster_members_per_master() {
    // One standalone server and two clusters: no quorum without a cluster's vote.
    let standalone = RedisCluster::start(1).expect("start redis-server");
    let members = [one_master_cluster(), one_master_cluster()];
    let nodes = format!(
        "{},redis+cluster://127.0.0.1:{},redis+cluster://127.0.0.1:{}",
        nodes(&standalone),
        members[0].port(),
        members[1].port()
    );
    let report = bench_json(
        &standalone,
        &[
            "--nodes",
            &nodes,
            "--threads",
            "2",
            "--duration",
            "300ms",
            "--rounds",
            "1",
        ],
    );
    let run = &report["threads"][0];
    assert_eq!(
        run["masters_per_node"],
        serde_json::json!([1, 1, 1]),
        "{run}"
    );
    // The raw baseline addresses one server per node: left out for a cluster.
    assert!(run["raw_n"].is_null(), "{run}");
    let ours = &run["ours"];
    assert!(ours["cycles"].as_u64().unwrap() >= 10, "{ours}");
    // A loaded machine may time a node out; anything else is a failure.
    let reasons = ours["failure_reasons"].as_object().expect("reasons");
    assert!(
        reasons.keys().all(|why| why.contains("timed out")),
        "{ours}"
    );
    let by_server = ours["server_cpu_us_per_cycle_by_server"]
        .as_array()
        .expect("by server");
    assert_eq!(by_server.len(), 3, "{ours}");
    // The clusters' masters did work for the cycles: the locks went there.
    assert!(by_server[1].as_f64().unwrap() > 0.0, "{ours}");
    assert!(by_server[2].as_f64().unwrap() > 0.0, "{ours}");
    let keys = |addr| {
        keys(addr)
            .into_iter()
            .filter(|k| k.starts_with(b"redlock-mux:bench:"))
            .count()
    };
    for member in &members {
        assert_eq!(keys(member.addr()), 0, "no lock left on a cluster");
    }

    // The other modes still refuse a cluster, as a usage error.
    let out = output(
        &standalone,
        &["bench", "--mode", "mutex", "--nodes", &nodes],
    );
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--mode threads only"),
        "{}",
        both(&out)
    );
}

#[test]
fn bench_exits_cleanly_on_a_broken_pipe() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    // As `redlock-mux bench | head -0`: the reader is gone before anything is written.
    let mut child = redlock_mux(
        &cluster,
        &["bench", "--iters", "200", "--nodes", &nodes(&cluster)],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    drop(child.stdout.take());
    let status = wait_at_most(&mut child, Duration::from_secs(60));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(!stderr.contains("panicked"), "{status:?}\n{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn bench_speaks_to_users_not_of_issues() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    for mode in [
        "mutex",
        "read",
        "write",
        "semaphore",
        "downgrade",
        "handoff",
    ] {
        let out = output(
            &cluster,
            &[
                "bench",
                "--nodes",
                &nodes(&cluster),
                "--iters",
                "200",
                "--mode",
                mode,
            ],
        );
        assert!(out.status.success(), "{}", both(&out));
        let text = both(&out);
        assert!(!text.contains("issue"), "{mode}: {text}");
        // Comparisons, not the project's own targets: no verdicts for users to read.
        for verdict in ["goal", "[met]", "[missed]"] {
            assert!(!text.contains(verdict), "{mode}: {verdict:?} in {text}");
        }
    }
}

#[test]
fn bench_starts_the_server_it_is_given_and_names_it() {
    let help = std::process::Command::new(BIN)
        .args(["bench", "--help"])
        .output()
        .expect("run bench --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--server PATH"), "{help}");
    assert!(help.contains("--tls"), "{help}");
    // The binary the tests use, given by path: the output names it as INFO server does.
    let program = std::env::var("REDLOCK_MUX_REDIS_SERVER").unwrap_or_else(|_| {
        let out = std::process::Command::new("sh")
            .args(["-c", "command -v redis-server"])
            .output()
            .expect("sh");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    });
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--instances",
            "1",
            "--iters",
            "200",
            "--server",
            &program,
        ])
        .env_remove("REDLOCK_NODES")
        .env_remove("REDLOCK_MUX_REDIS_SERVER")
        .output()
        .expect("run bench");
    let text = both(&out);
    assert!(out.status.success(), "{text}");
    let started = text
        .lines()
        .find(|l| l.starts_with("started 1 local "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        started.starts_with("started 1 local redis-server ")
            || started.starts_with("started 1 local valkey-server "),
        "{started}"
    );
    assert!(text.contains(&started["started ".len()..]), "{text}");

    // --tls measures TLS against plaintext where the command has TLS, and says it has not
    // where it has not.
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--tls",
            "--instances",
            "1",
            "--iters",
            "200",
            "--json",
        ])
        .env_remove("REDLOCK_NODES")
        .output()
        .expect("run bench --tls");
    if cfg!(feature = "tls") {
        let text = both(&out);
        if text.contains("TLS support") {
            eprintln!("skipped bench --tls: this server has no TLS ({program})");
            return;
        }
        assert!(out.status.success(), "{text}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let row = &report["tls"][0];
        assert_eq!(row["n"], 1, "{report}");
        assert_summary(&row["tls"]["acquire"], 200);
        assert_summary(&row["plaintext"]["cycle"], 200);
    } else {
        assert_eq!(out.status.code(), Some(64), "{}", both(&out));
        assert!(both(&out).contains("`tls` feature"), "{}", both(&out));
    }
}

/// `bench --sentinel` starts plain members, masters with a replica named with `?wait=1` and
/// Sentinel members, and prints acquire and cycle p50/p99 of each with their ratios to the
/// plain members.
#[test]
fn bench_sentinel_measures_sentinel_members_and_wait_next_to_plain_ones() {
    let help = std::process::Command::new(BIN)
        .args(["bench", "--help"])
        .output()
        .expect("run bench --help");
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--sentinel"),
        "{}",
        both(&help)
    );
    let out = std::process::Command::new(BIN)
        .args(["bench", "--sentinel", "--instances", "1", "--iters", "200"])
        .env_remove("REDLOCK_NODES")
        .output()
        .expect("run bench --sentinel");
    let text = both(&out);
    assert!(out.status.success(), "{text}");
    println!("{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("Sentinel members and ?wait=1 next to plain members: 1 members"),
        "{stdout}"
    );
    for (members, op) in [
        ("plain", "acquire"),
        ("plain", "cycle"),
        ("sentinel", "acquire"),
        ("sentinel", "cycle"),
        ("wait=1", "acquire"),
        ("wait=1", "cycle"),
    ] {
        let row = stdout
            .lines()
            .find(|l| {
                let mut words = l.split_whitespace();
                words.next() == Some(members) && words.next() == Some(op)
            })
            .unwrap_or_else(|| panic!("no {members} {op} row: {stdout}"));
        // p50, its ratio, p99, its ratio.
        let ratios: Vec<f64> = row
            .split_whitespace()
            .filter_map(|w| w.strip_suffix('x')?.parse().ok())
            .collect();
        assert_eq!(ratios.len(), 2, "{row}");
        assert!(ratios.iter().all(|r| *r > 0.0), "{row}");
        if members == "plain" {
            assert_eq!(ratios, [1.0, 1.0], "{row}");
        }
    }
    // Each variant's detail rows count every cycle, none failed.
    let cycles: Vec<&str> = stdout
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("cycle"))
        .collect();
    assert_eq!(cycles.len(), 3, "{stdout}");
    for l in cycles {
        assert_eq!(l.split_whitespace().last(), Some("0"), "errors: {l}");
    }
}
