//! Unix domain sockets: `unix:///path/to/redis.sock[?db=N&user=U&pass=P]` and
//! `redis+unix:///path…`, against `redis-server` processes started with `--unixsocket`, alone
//! and in a quorum with TCP nodes.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, InvalidArgument, NodeErrorKind};

/// A server that also listens on a Unix socket in a directory of its own; the socket's path.
fn unix_server(extra: &[&str]) -> (RedisServer, PathBuf, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let socket = dir.path.join("redis.sock");
    let mut args = vec![
        "--unixsocket",
        socket.to_str().unwrap(),
        "--unixsocketperm",
        "700",
    ];
    args.extend(extra);
    let server = RedisServer::start_with(&args).expect("start redis-server with --unixsocket");
    (server, socket, dir)
}

/// A private directory, removed on drop: socket paths must be short (108 bytes), so not the
/// server's own directory.
mod tempdir {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub struct Dir {
        pub path: PathBuf,
    }

    impl Dir {
        pub fn new() -> Dir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "rlm-unix-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[test]
fn locks_over_a_unix_socket_with_auth_and_select() {
    let (server, socket, _dir) = unix_server(&["--requirepass", "pw"]);
    let url = format!("unix://{}?db=3&pass=pw", socket.display());
    let client = Client::builder().nodes([&url]).build().expect("client");
    let lock = client
        .try_lock("unix:a", Duration::from_secs(10))
        .expect("lock");
    let stored = cmds(
        server.addr(),
        &[&[b"AUTH", b"pw"], &[b"SELECT", b"3"], &[b"GET", b"unix:a"]],
    );
    assert_eq!(stored[2], Value::Bulk(Some(lock.token().to_vec())));
    // Waiting works: the release announcement comes over the socket's pub/sub connection.
    let waited = std::thread::scope(|s| {
        let t = s.spawn(|| client.lock("unix:a", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(50));
        lock.release().unwrap();
        t.join().unwrap()
    });
    waited.expect("lock after a wait").release().unwrap();
    let rw = client
        .try_write_lock("unix:rw", Duration::from_secs(10))
        .expect("write lock");
    rw.release().unwrap();

    // A wrong password is a configuration error, as over TCP.
    let wrong = format!("redis+unix://{}?pass=nope", socket.display());
    match Client::builder().nodes([&wrong]).build() {
        Err(Error::Config { failures }) => {
            assert!(
                matches!(
                    failures[0].kind,
                    NodeErrorKind::Setup {
                        command: "AUTH",
                        ..
                    }
                ),
                "{failures:?}"
            );
            assert_eq!(failures[0].addr, socket.display().to_string());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_quorum_of_unix_and_tcp_nodes() {
    let (_a, socket_a, _da) = unix_server(&[]);
    let (_b, socket_b, _db) = unix_server(&[]);
    let c = RedisServer::start().expect("start redis-server");
    let urls = [
        format!("unix://{}", socket_a.display()),
        format!("redis+unix://{}", socket_b.display()),
        c.url(),
    ];
    let client = Client::builder().nodes(&urls).build().expect("client");
    let lock = client
        .try_lock("unix:quorum", Duration::from_secs(10))
        .expect("lock");
    assert!(get(c.addr(), b"unix:quorum").is_some());
    lock.release().unwrap();
    // A socket nobody listens on is a node that is down, not a configuration error.
    let gone = socket_a.with_file_name("gone.sock");
    let client = Client::builder()
        .nodes([
            format!("unix://{}", gone.display()),
            format!("unix://{}", socket_b.display()),
            c.url(),
        ])
        .build()
        .expect("a node down");
    client
        .try_lock("unix:down", Duration::from_secs(10))
        .expect("quorum without it")
        .release()
        .unwrap();
}

#[test]
fn two_nodes_naming_one_socket_are_duplicates() {
    let (_server, socket, dir) = unix_server(&[]);
    let other_spelling = dir.path.join(".").join("redis.sock");
    for second in [
        format!("redis+unix://{}?db=1", socket.display()),
        format!("unix://{}", other_spelling.display()),
    ] {
        match Client::builder()
            .nodes([format!("unix://{}", socket.display()), second.clone()])
            .build()
        {
            Err(Error::InvalidArgument(InvalidArgument::DuplicateNode { url })) => {
                assert_eq!(url, second)
            }
            other => panic!("{second}: {other:?}"),
        }
    }
}

/// A socket path longer than the system's `sun_path` holds (107 bytes and the NUL on Linux) can
/// never be connected to: it is a bad URL at `build()`, not a wait on every lock.
#[test]
fn a_socket_path_longer_than_the_system_allows_is_refused_at_build() {
    let limit = if cfg!(target_os = "linux") { 107 } else { 103 };
    let dir = tempdir::Dir::new();
    // A path of exactly `len` bytes under the test's own directory.
    let path_of = |len: usize| {
        let base = dir.path.join("s");
        let base = base.to_str().unwrap().to_owned();
        assert!(base.len() < len, "{base}");
        format!("{base}{}", "x".repeat(len - base.len()))
    };
    for len in [limit + 1, limit + 2, 300] {
        let path = path_of(len);
        assert_eq!(path.len(), len);
        for url in [
            format!("unix://{path}"),
            format!("redis+unix://{path}?db=1"),
        ] {
            let started = std::time::Instant::now();
            match Client::builder().nodes([url.as_str()]).build() {
                Err(Error::InvalidArgument(InvalidArgument::BadUrl { url: u, reason })) => {
                    assert_eq!(u, url);
                    assert!(reason.contains("too long"), "{reason}");
                }
                other => panic!("{len} bytes: {url}: expected BadUrl, got {other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(1));
        }
        // Percent-escapes count as the bytes they stand for.
        let escaped = format!("unix://{}", path.replacen('x', "%78", 5));
        assert!(
            matches!(
                Client::builder().nodes([escaped.as_str()]).build(),
                Err(Error::InvalidArgument(InvalidArgument::BadUrl { .. }))
            ),
            "{escaped}"
        );
    }
    // The longest path the system takes is a valid URL (nothing listens there: the client
    // is built, its lock would fail on the connect).
    let longest = format!("unix://{}", path_of(limit));
    Client::builder()
        .nodes([longest.as_str()])
        .build()
        .expect("a path of the longest length the system takes");
}
