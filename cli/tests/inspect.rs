//! `redlock-mux inspect` against real redis-server processes: passwords never shown, URLs read
//! by the library's parser, an exit status that tells a quorum-less or non-Redis node list
//! apart from a healthy one.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const KEY: &str = "inspect:job";

/// `redlock-mux inspect KEY --nodes NODES ARGS` without `REDLOCK_NODES`.
fn inspect(nodes: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["inspect", KEY, "--nodes", nodes])
        .args(args)
        .env_remove("REDLOCK_NODES")
        .output()
        .expect("run inspect")
}

/// A port on 127.0.0.1 where nothing listens (bound, then closed).
fn closed_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A TCP server that answers anything like a web server does, for 20 s at most: an address
/// that is not a Redis server's.
fn not_redis() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut buf = [0u8; 512];
                    let _ = stream.read(&mut buf);
                    let _ =
                        stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    port
}

#[test]
fn inspect_never_prints_a_password() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]).expect("redis-server");
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}", server.port());
    let down = format!("redis://app:s3cret-pw@127.0.0.1:{}", closed_port());
    for nodes in [url.clone(), format!("{url},{down}")] {
        let out = inspect(&nodes, &[]);
        let text = both(&out);
        assert!(!text.contains("s3cret-pw"), "a password on screen:\n{text}");
        assert!(
            text.contains(&format!("127.0.0.1:{}", server.port())),
            "the node is not named:\n{text}"
        );
    }
    // A URL the parser refuses is shown without its password too.
    let bad = format!("redis://:s3cret-pw@127.0.0.1:{}/notadb", server.port());
    for args in [
        vec!["inspect", KEY, "--nodes", &bad],
        vec!["run", "--nodes", &bad, KEY, "--", "true"],
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .expect("run");
        let text = both(&out);
        assert!(!out.status.success(), "{text}");
        assert!(!text.contains("s3cret-pw"), "a password on screen:\n{text}");
    }
}

#[test]
fn inspect_reads_urls_as_the_library_does() {
    let server = RedisServer::start_with(&["--requirepass", "p@ss"]).expect("redis-server");
    let client = redlock_mux::Client::builder()
        .nodes([format!("redis://:p%40ss@127.0.0.1:{}", server.port())])
        .build()
        .expect("the library reads the URL");
    let lock = client
        .lock(KEY, Duration::from_secs(30))
        .expect("lock through the URL");
    for url in [
        format!("redis://:p%40ss@127.0.0.1:{}", server.port()),
        format!("redis://default:p%40ss@127.0.0.1:{}/0", server.port()),
    ] {
        let out = inspect(&url, &[]);
        let text = both(&out);
        assert!(out.status.success(), "{url}: {text}");
        assert!(!text.contains("unreachable"), "{url}: {text}");
        assert!(text.contains("HELD"), "{url}: {text}");
    }
    lock.release().expect("release");
}

#[test]
fn inspect_fails_without_a_quorum_or_with_a_node_that_is_not_redis() {
    // No node answers.
    let nobody = format!("127.0.0.1:{},127.0.0.1:{}", closed_port(), closed_port());
    let out = inspect(&nobody, &["--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(69), "{}", both(&out));

    // Two Redis servers and a web server: a quorum answers, but one node is not Redis.
    let cluster = RedisCluster::start(2).expect("redis-server");
    let nodes = format!("{},127.0.0.1:{}", cluster.urls().join(","), not_redis());
    let out = inspect(&nodes, &["--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(78), "{}", both(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not a Redis server"),
        "{}",
        both(&out)
    );

    // The two Redis servers alone are fine.
    let out = inspect(&cluster.urls().join(","), &[]);
    assert!(out.status.success(), "{}", both(&out));
}

#[test]
fn inspect_json_has_every_node_and_the_summary() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let client = client(&cluster);
    let lock = client.lock(KEY, Duration::from_secs(30)).expect("lock");
    let reader = client
        .read_lock(KEY, Duration::from_secs(30))
        .expect("read lock");
    let out = inspect(&cluster.urls().join(","), &["--json"]);
    assert!(out.status.success(), "{}", both(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let prefix = String::from_utf8_lossy(&lock.token()[..12]).into_owned();
    assert_eq!(report["key"], KEY);
    assert_eq!(report["quorum"], 2);
    assert_eq!(report["reachable"], 3);
    assert_eq!(report["exit_status"], 0);
    let nodes = report["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    for (node, url) in nodes.iter().zip(cluster.urls()) {
        assert_eq!(node["state"], "reachable", "{node}");
        assert_eq!(node["url"], url);
        assert_eq!(node["mutex"]["state"], "held");
        assert!(node["mutex"]["token_prefix"]
            .as_str()
            .unwrap()
            .starts_with(&prefix));
        assert_eq!(node["readers"]["live"].as_array().unwrap().len(), 1);
    }
    let summary = &report["summary"];
    assert_eq!(summary["mutex"]["state"], "held");
    assert_eq!(summary["mutex"]["on"], 3);
    assert!(summary["mutex"]["pttl_ms"].as_i64().unwrap() > 0);
    assert_eq!(summary["writer"]["state"], "free");
    assert_eq!(summary["readers"].as_array().unwrap().len(), 1);
    assert_eq!(summary["queue"], 0);
    // The library's view: every node answered every probe round.
    for node in report["client"]["nodes"].as_array().expect("nodes") {
        assert_eq!(node["answered"], 3, "{node}");
        assert_eq!(node["latency_samples"], 3, "{node}");
    }
    lock.release().expect("release");
    reader.release().expect("release");

    // Without a quorum: the nodes' states, no summary, status 69.
    let nobody = format!("127.0.0.1:{}", closed_port());
    let out = inspect(&nobody, &["--json", "--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(69), "{}", both(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["nodes"][0]["state"], "unreachable");
    assert!(report["summary"].is_null());
    assert_eq!(report["client"]["nodes"][0]["answered"], 0);
}

#[test]
fn inspect_shows_the_library_clients_latency_and_failures_per_node() {
    // Two Redis servers and a node that is down; a lock is held on the key inspected.
    let cluster = RedisCluster::start(2).expect("redis-server");
    let holder = client(&cluster);
    let lock = holder.lock(KEY, Duration::from_secs(30)).expect("lock");
    let nodes = format!("{},127.0.0.1:{}", cluster.urls().join(","), closed_port());

    let out = inspect(&nodes, &["--json", "--timeout", "1s"]);
    assert!(out.status.success(), "{}", both(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let probe = &report["client"];
    assert_eq!(probe["probe_rounds"], 3, "{probe}");
    let stats = probe["nodes"].as_array().expect("per-node stats");
    assert_eq!(stats.len(), 3, "{probe}");
    for up in &stats[..2] {
        let p50 = up["latency_p50_us"]
            .as_u64()
            .expect("a p50 once the node answered");
        let p99 = up["latency_p99_us"].as_u64().expect("a p99");
        assert_eq!(up["answered"], 3, "{up}");
        assert_eq!(up["latency_samples"], 3, "{up}");
        assert!(p50 <= p99, "{up}");
        assert_eq!(up["failures"]["timeout"], 0, "{up}");
        assert_eq!(up["failures"]["connect"], 0, "{up}");
    }
    let down = &stats[2];
    assert_eq!(down["answered"], 0, "{down}");
    assert_eq!(down["latency_samples"], 0, "{down}");
    assert!(down["latency_p50_us"].is_null(), "{down}");
    let failed: u64 = down["failures"]
        .as_object()
        .expect("failures")
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(failed >= 1, "the down node shows no failure: {down}");

    let out = inspect(&nodes, &["--timeout", "1s"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", both(&out));
    assert!(
        text.contains("library client: 3 probe rounds per node"),
        "{text}"
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("node ") && l.contains("latency p50"))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("ms p99") && lines[0].contains(", 0 failures"),
        "{text}"
    );
    assert!(lines[2].contains("latency p50 - p99 -"), "{text}");
    assert!(!lines[2].contains(", 0 failures"), "{text}");

    // The probes wrote nothing and left the inspected lock as it was.
    for addr in cluster.addrs() {
        assert_eq!(get(addr, KEY.as_bytes()), Some(lock.token().to_vec()));
        assert_eq!(keys(addr), vec![KEY.as_bytes().to_vec()], "keys on {addr}");
    }
    lock.release().expect("release");
}

#[test]
fn inspect_names_each_nodes_server_and_reads_unix_sockets() {
    let dir = std::env::temp_dir().join(format!("rlm-cli-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the socket");
    let socket = dir.join("redis.sock");
    let server = RedisServer::start_with(&["--unixsocket", socket.to_str().unwrap()])
        .expect("redis-server with --unixsocket");
    let nodes = format!("unix://{}?db=2,{}", socket.display(), server.url());
    let out = inspect(&nodes, &[]);
    let text = both(&out);
    assert!(out.status.success(), "{text}");
    let named = |line: &str| {
        line.contains("reachable, redis-server ") || line.contains("reachable, valkey-server ")
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("node ")).collect();
    assert!(
        lines[0].contains(&format!("unix://{}?db=2", socket.display())) && named(lines[0]),
        "{text}"
    );
    assert!(named(lines[1]), "{text}");
    let out = inspect(&nodes, &["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for node in report["nodes"].as_array().expect("nodes") {
        let name = node["server"]["name"].as_str().unwrap_or_default();
        assert!(name == "redis" || name == "valkey", "{node}");
        assert!(node["server"]["version"]
            .as_str()
            .is_some_and(|v| v.contains('.')));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
