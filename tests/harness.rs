//! Smoke tests of the test harness itself: local redis-server processes and
//! the scripted fake server.

mod common;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;

fn pong() -> Value {
    Value::Simple(b"PONG".to_vec())
}

/// Whether a process with this PID exists (`kill -0`).
fn pid_alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Waits up to 5 s for a PID to disappear (it may be reaped by init).
fn pid_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !pid_alive(pid) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn cluster_ping_pause_kill_restart_and_drop() {
    let mut cluster = RedisCluster::start(3).expect("start 3 redis-server");
    assert_eq!(cluster.len(), 3);
    assert!(!cluster.is_empty());
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (server, url) in cluster.servers.iter().zip(&urls) {
        assert_eq!(*url, format!("redis://127.0.0.1:{}", server.port()));
        assert_eq!(
            server.addr().to_string(),
            format!("127.0.0.1:{}", server.port())
        );
        assert_eq!(cmd(server.addr(), &[b"PING"]), pong());
        assert!(server.dir().is_dir());
    }
    let pids: Vec<u32> = cluster.servers.iter().map(|s| s.pid()).collect();
    let dirs: Vec<PathBuf> = cluster
        .servers
        .iter()
        .map(|s| s.dir().to_path_buf())
        .collect();
    for pid in &pids {
        assert!(pid_alive(*pid));
    }

    // A paused server accepts the connection (the kernel does) but never answers.
    let paused = &cluster.servers[0];
    paused.pause().expect("pause");
    let err = try_cmd(paused.addr(), &[b"PING"], Duration::from_millis(300))
        .expect_err("a paused server must not answer");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    paused.resume().expect("resume");
    assert_eq!(cmd(paused.addr(), &[b"PING"]), pong());

    // A killed server refuses connections; a restarted one is back on the same port.
    let killed = &mut cluster.servers[1];
    let port = killed.port();
    let old_pid = killed.pid();
    killed.kill().expect("kill");
    killed.kill().expect("kill is idempotent");
    assert!(!killed.is_running());
    assert!(pid_gone(old_pid));
    let err = TcpStream::connect(killed.addr()).expect_err("killed server must refuse");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    killed.restart().expect("restart");
    assert!(killed.is_running());
    assert_eq!(killed.port(), port);
    assert_ne!(killed.pid(), old_pid);
    assert_eq!(cmd(killed.addr(), &[b"PING"]), pong());

    let mut pids = pids;
    pids[1] = cluster.servers[1].pid();
    // Leave one paused: Drop must cope with that too.
    cluster.servers[2].pause().expect("pause");
    drop(cluster);
    for pid in pids {
        assert!(pid_gone(pid), "redis-server {pid} still running after drop");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} not removed", dir.display());
    }
}

#[test]
fn helpers_read_and_write_data() {
    let server = RedisServer::start().expect("start");
    let addr = server.addr();
    assert_eq!(dbsize(addr), 0);
    set(addr, b"k1", b"v1");
    set(addr, b"k0", b"\x00\xffbinary");
    assert_eq!(get(addr, b"k1"), Some(b"v1".to_vec()));
    assert_eq!(get(addr, b"k0"), Some(b"\x00\xffbinary".to_vec()));
    assert_eq!(get(addr, b"missing"), None);
    assert_eq!(keys(addr), vec![b"k0".to_vec(), b"k1".to_vec()]);
    assert_eq!(dbsize(addr), 2);
    assert_eq!(pttl(addr, b"k1"), -1);
    assert_eq!(pttl(addr, b"missing"), -2);
    assert_eq!(cmd(addr, &[b"PEXPIRE", b"k1", b"10000"]), Value::Integer(1));
    let ttl = pttl(addr, b"k1");
    assert!(ttl > 0 && ttl <= 10_000, "{ttl}");
    flushall(addr);
    assert_eq!(dbsize(addr), 0);
    assert!(matches!(cmd(addr, &[b"NOSUCHCOMMAND"]), Value::Error(_)));
}

#[test]
fn password_and_aof_survive_restart() {
    let mut server = RedisServer::start_with(&[
        "--requirepass",
        "pw",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .expect("start with password and AOF");
    let addr = server.addr();
    match cmd(addr, &[b"PING"]) {
        Value::Error(e) => assert!(e.starts_with(b"NOAUTH"), "{e:?}"),
        other => panic!("expected NOAUTH, got {}", show(&other)),
    }
    assert_eq!(
        cmd_auth(addr, "pw", &[b"SET", b"kept", b"yes"]),
        Value::Simple(b"OK".to_vec())
    );
    server.kill().expect("kill");
    server.restart().expect("restart");
    assert_eq!(
        cmd_auth(addr, "pw", &[b"GET", b"kept"]),
        Value::Bulk(Some(b"yes".to_vec()))
    );
}

#[test]
fn panicking_test_body_still_stops_its_server() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let server = RedisServer::start().expect("start");
        tx.send((server.pid(), server.dir().to_path_buf())).unwrap();
        assert_eq!(cmd(server.addr(), &[b"PING"]), pong());
        panic!("test body fails while its server runs");
    });
    assert!(result.is_err());
    let (pid, dir) = rx.recv().expect("server started");
    assert!(pid_gone(pid), "redis-server {pid} survived a panic");
    assert!(!dir.exists());
}

#[test]
fn fake_server_scripts_replies() {
    let fake = FakeServer::start(|args| match args[0].as_slice() {
        b"PING" => FakeReply::simple("PONG"),
        b"GET" => FakeReply::bulk(Some(b"fake")),
        b"GARBAGE" => FakeReply::Bytes(b"!not resp\r\n".to_vec()),
        b"TRUNCATED" => FakeReply::Bytes(b"$10\r\nabc".to_vec()),
        b"HANG" => FakeReply::Silent,
        b"BYE" => FakeReply::Close,
        _ => FakeReply::error("ERR unknown command"),
    })
    .expect("fake server");
    let addr = fake.addr();
    assert_eq!(fake.url(), format!("redis://127.0.0.1:{}", addr.port()));

    assert_eq!(cmd(addr, &[b"PING"]), pong());
    assert_eq!(
        cmd(addr, &[b"GET", b"key"]),
        Value::Bulk(Some(b"fake".to_vec()))
    );
    assert!(matches!(cmd(addr, &[b"DELEX"]), Value::Error(_)));

    let short = Duration::from_millis(300);
    let err = try_cmd(addr, &[b"GARBAGE"], short).expect_err("garbage");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let err = try_cmd(addr, &[b"TRUNCATED"], short).expect_err("truncated");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    let err = try_cmd(addr, &[b"HANG"], short).expect_err("silent");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    let err = try_cmd(addr, &[b"BYE"], short).expect_err("closed");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ),
        "{err:?}"
    );

    // Pipelined commands on one connection are answered in order.
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
        .unwrap();
    let want: &[u8] = b"+PONG\r\n$4\r\nfake\r\n";
    let mut got = vec![0u8; want.len()];
    stream.read_exact(&mut got).unwrap();
    assert_eq!(got, want);

    let names: Vec<Vec<u8>> = fake.commands().into_iter().map(|c| c[0].clone()).collect();
    assert_eq!(names.first().map(Vec::as_slice), Some(&b"PING"[..]));
    assert_eq!(names.len(), 9);

    // Dropping the fake stops it even with a client still connected.
    let started = Instant::now();
    drop(fake);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(stream);
    assert!(TcpStream::connect(addr).is_err());
}
