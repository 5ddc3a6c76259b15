//! Node addresses given by host name. `localhost` resolves to `::1` before `127.0.0.1` where
//! `/etc/hosts` lists both (Debian's stock file does), and a server bound to `127.0.0.1`
//! (as the tests and the bench start them) refuses connections on `::1`: the client must try
//! every address the name resolved to, in order, as `redis-cli -h localhost` does, say which
//! it tried when none answers, and still refuse one server given under two names.
//!
//! The tests that need `localhost` to resolve to `::1` first check it. On a machine whose
//! `/etc/hosts` gives `127.0.0.1` only, each runs itself again in a private mount namespace
//! (`unshare --mount`) over Debian's stock `/etc/hosts`, which changes nothing outside that
//! process; where that is not allowed, it says so and is skipped.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::RedisServer;
use redlock_mux::{Client, Error, InvalidArgument};

/// Set in the copy of a test that runs over Debian's stock `/etc/hosts`.
const CHILD: &str = "REDLOCK_ADDRESSES_CHILD";

/// Debian's stock `/etc/hosts` (netbase): `localhost` is `127.0.0.1` and `::1`.
const DEBIAN_HOSTS: &str = "127.0.0.1\tlocalhost\n\
                            ::1\tlocalhost ip6-localhost ip6-loopback\n\
                            ff02::1\tip6-allnodes\n\
                            ff02::2\tip6-allrouters\n";

const TTL: Duration = Duration::from_secs(10);

fn resolve_localhost(port: u16) -> Vec<SocketAddr> {
    ("localhost", port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default()
}

/// Whether the resolver gives `::1` for `localhost` first, and `127.0.0.1` after it.
fn v6_first() -> bool {
    let addrs = resolve_localhost(1);
    addrs
        .first()
        .is_some_and(|a| a.is_ipv6() && a.ip().is_loopback())
        && addrs.iter().any(|a| a.ip() == Ipv4Addr::LOCALHOST)
}

/// True when this process may run `test`: `localhost` resolves to `::1` first. Otherwise runs
/// `test` (this binary, that test only) in a private mount namespace over Debian's stock
/// `/etc/hosts`, requires it to pass, and returns false; or, where no such namespace can be
/// made, says why the test is skipped and returns false.
fn over_debian_hosts(test: &str) -> bool {
    if v6_first() {
        return true;
    }
    assert!(
        std::env::var_os(CHILD).is_none(),
        "{test}: localhost resolves to {:?} even over Debian's stock /etc/hosts",
        resolve_localhost(1)
    );
    let hosts =
        std::env::temp_dir().join(format!("redlock-mux-hosts-{}-{test}", std::process::id()));
    std::fs::write(&hosts, DEBIAN_HOSTS).expect("write the hosts file");
    let result = rerun(test, &hosts);
    let _ = std::fs::remove_file(&hosts);
    match result {
        Some(status) => {
            assert!(status, "{test} failed over Debian's stock /etc/hosts");
        }
        None => eprintln!(
            "{test}: skipped: localhost resolves to {:?} here, not to ::1 first, and no private \
             mount namespace could be made to put Debian's stock /etc/hosts in place (run it \
             as root or where `unshare --mount --map-root-user` is allowed)",
            resolve_localhost(1)
        ),
    }
    false
}

/// Runs `test` in a private mount namespace with `hosts` bound over `/etc/hosts`: `None` if
/// no such namespace can be made, else whether the test passed.
fn rerun(test: &str, hosts: &PathBuf) -> Option<bool> {
    let exe = std::env::current_exe().expect("the test binary");
    // `$0` is the hosts file; the rest is the command to run.
    let script = r#"mount --bind "$0" /etc/hosts && exec "$@""#;
    for unshare in [&["--mount"][..], &["--mount", "--map-root-user"]] {
        let works = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c", script])
            .arg(hosts)
            .arg("true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !works {
            continue;
        }
        let out = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c", script])
            .arg(hosts)
            .arg(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .output()
            .expect("run the test again");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        return Some(out.status.success());
    }
    None
}

/// A port nobody listens on (a moment ago, on 127.0.0.1).
fn dead_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Whether anything accepts a connection at `addr`.
fn accepts(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

#[test]
fn localhost_reaches_servers_bound_to_127_0_0_1_only() {
    let test = "localhost_reaches_servers_bound_to_127_0_0_1_only";
    if !over_debian_hosts(test) {
        return;
    }
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("start redis-server"))
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://localhost:{}", s.port()))
        .collect();
    for s in &servers {
        let port = s.port();
        assert_eq!(
            resolve_localhost(port)[0],
            SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port))
        );
        assert!(!accepts(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port))));
        assert!(accepts(SocketAddr::from((Ipv4Addr::LOCALHOST, port))));
    }
    let client = Client::builder()
        .nodes(&urls)
        .build()
        .expect("a client of localhost nodes");
    let lock = client.try_lock("addresses:a", TTL).expect("the lock");
    for s in &servers {
        assert!(
            common::get(s.addr(), b"addresses:a").is_some(),
            "{}",
            s.addr()
        );
    }
    lock.release().expect("the release");
    for s in &servers {
        assert_eq!(common::get(s.addr(), b"addresses:a"), None, "{}", s.addr());
    }
}

#[test]
fn localhost_and_127_0_0_1_on_one_port_are_one_node() {
    let test = "localhost_and_127_0_0_1_on_one_port_are_one_node";
    if !over_debian_hosts(test) {
        return;
    }
    let (p, q) = (dead_port(), dead_port());
    for (a, b) in [
        (
            format!("redis://localhost:{p}"),
            format!("redis://127.0.0.1:{p}"),
        ),
        (format!("127.0.0.1:{p}"), format!("localhost:{p}")),
        (
            format!("redis://[::1]:{p}"),
            format!("redis://localhost:{p}/2"),
        ),
    ] {
        let nodes = [a.clone(), b.clone(), format!("127.0.0.1:{q}")];
        match Client::builder().nodes(&nodes).build() {
            Err(Error::InvalidArgument(InvalidArgument::DuplicateNode { url })) => {
                assert_eq!(url, b)
            }
            other => panic!("{nodes:?}: {other:?}"),
        }
    }
}

#[test]
fn a_failed_connect_names_every_address_it_tried() {
    let test = "a_failed_connect_names_every_address_it_tried";
    if !over_debian_hosts(test) {
        return;
    }
    let port = dead_port();
    let client = Client::builder()
        .nodes([format!("redis://localhost:{port}")])
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("a client (its node is only down)");
    let error = client
        .try_lock("addresses:b", TTL)
        .expect_err("nothing listens");
    let text = error.to_string();
    for tried in [format!("[::1]:{port}"), format!("127.0.0.1:{port}")] {
        assert!(text.contains(&tried), "{tried} not in: {text}");
    }
    assert!(text.contains(&format!("localhost:{port}")), "{text}");
    assert!(text.contains("refused"), "{text}");
}
