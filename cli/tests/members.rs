//! The command with members that are not single servers, against real processes started by the
//! tests (stopped by PID): masters managed by Redis Sentinel (a master, a replica and three
//! sentinels, `redlock_mux_kit::sentinel`) and a Redis Cluster (`tests/common/cluster.rs`).
//! Sentinels that refuse the credentials, or know no such service, are a configuration error
//! (exit 78, the sentinels' answer in the message), for `run` as for `inspect`; `inspect` reads a
//! Sentinel member on the master its sentinels name, and a cluster on the masters that hold the
//! key's slots.

mod support;

#[allow(dead_code)]
#[path = "../../tests/common/cluster.rs"]
mod cluster;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cluster::ClusterMember;
use redlock_mux::Client;
use redlock_mux_kit::sentinel::SentinelMember;
use support::*;

const TTL: Duration = Duration::from_secs(30);
const EXIT_CONFIG: i32 = 78;

/// `redlock-mux ARGS` without `REDLOCK_NODES`, to its end.
fn command(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("REDLOCK_NODES")
        .stdin(Stdio::null())
        .output()
        .expect("run redlock-mux")
}

/// A one-try client of `urls`.
fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect("client")
}

/// The first `TOKEN_PREFIX` (12) characters of a token, as `inspect` shows it.
fn shown(token: &[u8]) -> String {
    String::from_utf8_lossy(&token[..12]).into_owned()
}

#[test]
fn sentinels_that_refuse_the_credentials_or_know_no_service_exit_78() {
    let member = SentinelMember::start(Some("sentinel-pw")).expect("sentinel member");
    let good = member.url("?sentinel_password=sentinel-pw");
    let wrong = member.url("?sentinel_password=wrong");
    let missing = member.url("");
    let unknown = good.replace(&member.service, "no-such-service");
    for (what, url, says) in [
        ("a wrong sentinel password", &wrong, "WRONGPASS"),
        ("no sentinel password", &missing, "NOAUTH"),
        ("a service no sentinel knows", &unknown, "no-such-service"),
    ] {
        let run = command(&["run", "--nodes", url, "-w", "5", "job", "--", "true"]);
        let text = both(&run);
        assert_eq!(run.status.code(), Some(EXIT_CONFIG), "run, {what}:\n{text}");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(says),
            "run, {what}: {says:?} not said:\n{text}"
        );
        assert!(
            !text.contains("sentinel-pw"),
            "a password on screen:\n{text}"
        );
        let inspect = command(&["inspect", "job", "--nodes", url]);
        let text = both(&inspect);
        assert_eq!(
            inspect.status.code(),
            Some(EXIT_CONFIG),
            "inspect, {what}:\n{text}"
        );
        assert!(
            text.contains(says),
            "inspect, {what}: {says:?} not said:\n{text}"
        );
        assert!(text.contains("refused"), "inspect, {what}:\n{text}");
        assert!(
            !text.contains("sentinel-pw"),
            "a password on screen:\n{text}"
        );
    }
    // The right password: `inspect` reads the lock on the master the sentinels name.
    let c = client(std::slice::from_ref(&good));
    let lock = c.try_lock("job", TTL).expect("lock");
    let out = command(&["inspect", "job", "--nodes", &good]);
    let text = both(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("mutex    {}", shown(lock.token()))),
        "the holder's token is not shown:\n{text}"
    );
    assert!(
        stdout.contains(&format!("HELD by {}", shown(lock.token()))),
        "{text}"
    );
    assert!(
        stdout.contains(&member.service),
        "the service is not named:\n{text}"
    );
    assert!(
        !text.contains("sentinel-pw"),
        "a password on screen:\n{text}"
    );
    lock.release().expect("release");
    let out = command(&["inspect", "job", "--nodes", &good]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("mutex:   FREE on a quorum"),
        "{}",
        both(&out)
    );
}

#[test]
fn inspect_reads_a_cluster_on_the_masters_of_the_key() {
    let cluster = ClusterMember::start(3, 0).expect("cluster");
    let url = cluster.url();
    let c = client(std::slice::from_ref(&url));
    // Keys on each of the three masters, so that most reads follow a MOVED.
    let mut keys: Vec<String> = Vec::new();
    for master in cluster.masters() {
        let key = (0..10_000)
            .map(|i| format!("job:{i}"))
            .find(|k| cluster.owner(cluster.slot(k.as_bytes()), master) == Some(master))
            .expect("a key on each master");
        keys.push(key);
    }
    for key in &keys {
        let lock = c.try_lock(key, TTL).expect("lock");
        let reader = c.try_read_lock(format!("{key}:r"), TTL).expect("read lock");
        for (inspected, line) in [
            (key.clone(), format!("mutex    {}", shown(lock.token()))),
            (format!("{key}:r"), "readers  1: ".to_owned()),
        ] {
            let out = command(&["inspect", &inspected, "--nodes", &url]);
            let text = both(&out);
            assert_eq!(out.status.code(), Some(0), "{inspected}:\n{text}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains(&line),
                "{inspected}: {line:?} not shown:\n{text}"
            );
            assert!(stdout.contains("redis+cluster://"), "{text}");
        }
        let out = command(&["inspect", key, "--nodes", &url, "--json"]);
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", both(&out)));
        assert_eq!(json["summary"]["mutex"]["state"], "held", "{json}");
        assert_eq!(
            json["summary"]["mutex"]["token_prefix"],
            format!("{}…", shown(lock.token())),
            "{json}"
        );
        lock.release().expect("release");
        reader.release().expect("release");
        let out = command(&["inspect", key, "--nodes", &url]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("mutex:   FREE on a quorum"),
            "{}",
            both(&out)
        );
    }
}
