//! Helpers shared by the command's tests: the library's test helpers (`tests/common`: real
//! `redis-server` processes and a tiny RESP client), running the binary, reading what the nodes
//! hold, a PATH made only of BusyBox applets, and processes watched by PID.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code, unused_imports)]

pub use redlock_mux_kit::local_servers::*;
pub use redlock_mux_kit::probe::*;
pub use redlock_mux_kit::{assert_settles, assert_settles_eq};

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::Client;

/// The command under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_redlock-mux");

/// The node list of `cluster`, as `--nodes` and `REDLOCK_NODES` take it.
pub fn nodes(cluster: &RedisCluster) -> String {
    cluster.urls().join(",")
}

/// `redlock-mux ARGS` with `REDLOCK_NODES` naming `cluster`.
pub fn redlock_mux(cluster: &RedisCluster, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env("REDLOCK_NODES", nodes(cluster));
    c
}

/// Runs `redlock-mux ARGS` to its end (with `REDLOCK_NODES` naming `cluster`).
pub fn output(cluster: &RedisCluster, args: &[&str]) -> Output {
    redlock_mux(cluster, args)
        .stdin(Stdio::null())
        .output()
        .expect("run redlock-mux")
}

/// Stdout and stderr of `out`, for assertion messages.
pub fn both(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits for `child` at most `limit`; kills it (by PID) and fails the test if it still runs.
pub fn wait_at_most(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("redlock-mux still running after {limit:?}");
}

/// The token on a quorum of the nodes for `key`, if one token is on a quorum.
pub fn holder_of(cluster: &RedisCluster, key: &str) -> Option<Vec<u8>> {
    let values: Vec<Option<Vec<u8>>> = cluster
        .servers
        .iter()
        .map(|s| get(s.addr(), key.as_bytes()))
        .collect();
    values.iter().flatten().find_map(|v| {
        let on = values.iter().filter(|o| o.as_ref() == Some(v)).count();
        (on > cluster.len() / 2).then(|| v.clone())
    })
}

/// Waits up to 10 s for someone to hold `key` on a quorum; returns the token.
pub fn wait_for_holder_of(cluster: &RedisCluster, key: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(token) = holder_of(cluster, key) {
            return token;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("nobody took the lock {key:?}");
}

/// What every node holds for `key`, one line per node: the value and its PTTL, or `absent`.
pub fn key_state(cluster: &RedisCluster, key: &str) -> String {
    let mut out = String::new();
    for (i, server) in cluster.servers.iter().enumerate() {
        let addr = server.addr();
        let line = match get(addr, key.as_bytes()) {
            None => "absent".to_owned(),
            Some(value) => format!(
                "{} (pttl {} ms)",
                String::from_utf8_lossy(&value),
                pttl(addr, key.as_bytes())
            ),
        };
        out.push_str(&format!("  node {i} ({addr}) {key}: {line}\n"));
    }
    out
}

/// A library client with a node timeout that tolerates a loaded test machine.
pub fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client")
}

/// A fresh path in the temporary directory, unique to this test process and `name`.
pub fn temp_file(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "redlock-mux-cli-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_file(&path);
    path
}

/// A directory holding one symlink per BusyBox applet, made once per test process: a PATH of
/// BusyBox applets only, as on Alpine or a BusyBox-based embedded system.
pub fn busybox_path() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let busybox = ["/usr/bin/busybox", "/bin/busybox"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .expect("busybox is not installed: run `bash .ci/install` (apt-get install busybox)");
        let dir = std::env::temp_dir().join(format!("redlock-mux-busybox-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("busybox dir");
        let list = Command::new(&busybox)
            .arg("--list")
            .output()
            .expect("busybox --list");
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            std::os::unix::fs::symlink(&busybox, dir.join(applet)).expect("symlink applet");
        }
        dir
    })
}

/// `redlock-mux ARGS` in an environment with nothing but `PATH` (BusyBox applets only) and
/// `REDLOCK_NODES` naming `cluster`.
pub fn under_busybox(cluster: &RedisCluster, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_clear()
        .env("PATH", busybox_path())
        .env("REDLOCK_NODES", nodes(cluster))
        .stdin(Stdio::null());
    c
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The command line of process `pid`, its arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .split('\0')
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The parent of process `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(pid))
        .collect()
}

/// PIDs a test started, directly or through the command, each with a piece of its command
/// line: whatever is still alive (and still that program) when the test ends is sent SIGKILL,
/// by PID, so that a failing test leaves nothing behind.
#[derive(Default)]
pub struct Reaper {
    pids: Vec<(u32, String)>,
}

impl Reaper {
    /// Watches `pid`, which runs a program whose command line contains `marker`.
    pub fn watch(&mut self, pid: u32, marker: &str) {
        self.pids.push((pid, marker.to_owned()));
    }

    /// Every watched PID still alive, and every process descended from one.
    pub fn alive(&self) -> Vec<u32> {
        let mut found: Vec<u32> = self
            .pids
            .iter()
            .filter(|(pid, marker)| alive(*pid) && cmdline(*pid).contains(marker.as_str()))
            .map(|(pid, _)| *pid)
            .collect();
        let mut i = 0;
        while i < found.len() {
            for child in children_of(found[i]) {
                if alive(child) && !found.contains(&child) {
                    found.push(child);
                }
            }
            i += 1;
        }
        found
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.alive() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Sends signal `name` (`TERM`, `INT`, ...) to `pid` with the `kill` program.
pub fn send(name: &str, pid: u32) {
    let sent = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(sent.success(), "kill -{name} {pid} failed");
}

/// Waits up to `limit` for `check`, polling every 20 ms; returns its last answer.
pub fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}
