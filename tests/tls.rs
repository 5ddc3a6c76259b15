//! TLS (`rediss://`, the `tls` feature) against `redis-server` processes started with
//! `--tls-port`, with certificates this test makes with the `openssl` command: a throw-away CA,
//! a server certificate for 127.0.0.1 and localhost, one for another name, and a client
//! certificate.
//!
//! Every lock kind works over TLS, with AUTH and SELECT; every way of reaching the wrong thing
//! (a certificate that does not verify, a name that does not match, a plaintext port on a TLS
//! URL and a TLS port on a plaintext one, a server that wants a client certificate) is a typed
//! `Error::Config` from `build()`, at once, and the server ran nothing. A TLS cluster whose nodes
//! have certificates of their own works: each seed is checked against its own host, each master
//! against the name the cluster announces for it.
//!
//! Servers built without TLS (the Redis 8.2 and Valkey 8.1 binaries CI takes from wheels say
//! "Failed finding TLS support") make these tests skip, saying so.
#![cfg(feature = "tls")]

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, InvalidArgument, NodeErrorKind, TlsFailure};

/// The certificates, made once per test process.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A CA, and certificates it signs: `server` (127.0.0.1, localhost), `elsewhere` (another
/// name only) and `client`; EC P-256 keys, valid two days.
fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("redlock-mux-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        redlock_mux_kit::pki::make_ca(&dir, "redlock-mux test CA", 2).expect("openssl CA");
        for (name, ext) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "elsewhere",
                "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
            // Cluster nodes, each with a certificate for its own address only (the cluster bus
            // uses it as a client certificate too).
            (
                "node1",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
            (
                "node2",
                "subjectAltName=IP:127.0.0.2\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
        ] {
            redlock_mux_kit::pki::sign(&dir, name, ext, 2)
                .unwrap_or_else(|e| panic!("{e} (apt-get install openssl)"));
        }
        Pki { dir }
    })
}

/// A server with a plaintext port (its `addr()`) and a TLS port showing `cert`, asking for
/// client certificates when `clients` is set; `None` when the binary has no TLS.
fn tls_server(cert: &str, clients: bool, extra: &[&str]) -> Option<(RedisServer, u16)> {
    let pki = pki();
    let port = free_port().unwrap().to_string();
    let (crt, key, ca) = (
        pki.file(&format!("{cert}.crt")),
        pki.file(&format!("{cert}.key")),
        pki.file("ca.crt"),
    );
    let mut args = vec![
        "--tls-port",
        &port,
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca.to_str().unwrap(),
        "--tls-auth-clients",
        if clients { "yes" } else { "no" },
    ];
    args.extend(extra);
    match RedisServer::start_with(&args) {
        Ok(server) => Some((server, port.parse().unwrap())),
        Err(e) if e.to_string().contains("TLS support") => {
            eprintln!(
                "skipped: this redis-server has no TLS (the Redis 8.2 and Valkey binaries from \
                 wheels are built without it): {}",
                e.to_string().lines().last().unwrap_or_default()
            );
            None
        }
        Err(e) => panic!("start redis-server with TLS: {e}"),
    }
}

fn trusting() -> redlock_mux::ClientBuilder {
    Client::builder()
        .tls_ca_file(pki().file("ca.crt"))
        .connect_timeout(Duration::from_millis(500))
}

/// The commands a server ran since its stats were reset, by name.
fn commands_run(addr: std::net::SocketAddr, password: Option<&str>) -> String {
    let args: &[&[u8]] = &[b"INFO", b"commandstats"];
    let info = match password {
        Some(p) => cmd_auth(addr, p, args),
        None => cmd(addr, args),
    };
    match info {
        Value::Bulk(Some(text)) => String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| l.split(':').next())
            .collect::<Vec<_>>()
            .join(","),
        other => panic!("INFO commandstats: {}", show(&other)),
    }
}

fn reset_stats(addr: std::net::SocketAddr) {
    cmd(addr, &[b"CONFIG", b"RESETSTAT"]);
}

/// The one TLS failure of a `build()` that failed as it must: at once, typed.
fn tls_failure(result: Result<Client, Error>, started: Instant) -> TlsFailure {
    let elapsed = started.elapsed();
    let e = result.expect_err("build must fail");
    assert!(e.is_config(), "{e:?}");
    assert!(!e.is_contended(), "{e:?}");
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}: {e}");
    match e.failures() {
        [f] => match &f.kind {
            NodeErrorKind::Setup { command, cause } if *command == "TLS" => match &**cause {
                NodeErrorKind::Tls(why) => {
                    let text = e.to_string();
                    assert!(text.contains("TLS"), "{text}");
                    why.clone()
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_lock_kind_works_over_tls_with_auth_and_select() {
    let mut servers = Vec::new();
    for extra in [&["--requirepass", "s3cret"][..], &[], &[]] {
        let Some(s) = tls_server("server", false, extra) else {
            return;
        };
        servers.push(s);
    }
    let urls = vec![
        format!("rediss://:s3cret@127.0.0.1:{}/2", servers[0].1),
        // The certificate names localhost too: checked against the name, whatever address it
        // resolves to first (a server bound to 127.0.0.1 only refuses ::1).
        format!("rediss://localhost:{}", servers[1].1),
        format!("rediss://127.0.0.1:{}?db=0", servers[2].1),
    ];
    let client = trusting().nodes(&urls).build().expect("client over TLS");
    let ttl = Duration::from_secs(10);

    let lock = client.try_lock("tls:mutex", ttl).expect("mutex");
    let token = lock.token().to_vec();
    // The key is in database 2 of the password-protected server.
    let addr0 = servers[0].0.addr();
    let stored = cmds(
        addr0,
        &[
            &[b"AUTH", b"s3cret"],
            &[b"SELECT", b"2"],
            &[b"GET", b"tls:mutex"],
        ],
    );
    assert_eq!(stored[2], Value::Bulk(Some(token)), "{}", show(&stored[2]));
    lock.release().expect("release");

    let r1 = client.try_read_lock("tls:rw", ttl).expect("read lock");
    let r2 = client.try_read_lock("tls:rw", ttl).expect("second reader");
    assert!(client
        .try_write_lock("tls:rw", ttl)
        .unwrap_err()
        .is_contended());
    r1.release().unwrap();
    r2.release().unwrap();
    let w = client.try_write_lock("tls:rw", ttl).expect("write lock");
    w.release().unwrap();
    let all = client
        .try_lock_all(["tls:a", "tls:b", "tls:c"], ttl)
        .expect("lock_all");
    all.release().unwrap();
    let f1 = client.try_lock_fenced("tls:f", ttl).expect("fenced");
    let first = f1.fencing_token();
    f1.release().unwrap();
    let f2 = client.try_lock_fenced("tls:f", ttl).expect("fenced again");
    assert!(f2.fencing_token() > first);
    f2.release().unwrap();
    let sem = client.semaphore("tls:sem", 2).expect("semaphore");
    let p1 = sem.try_acquire(ttl).expect("permit");
    let p2 = sem.try_acquire(ttl).expect("permit");
    assert!(sem.try_acquire(ttl).unwrap_err().is_contended());
    p1.release().unwrap();
    p2.release().unwrap();
    // Waiting works too: the release announcement comes over TLS pub/sub.
    let held = client
        .try_lock("tls:wait", Duration::from_millis(300))
        .unwrap();
    let waited = std::thread::scope(|s| {
        let t = s.spawn(|| client.lock("tls:wait", ttl));
        std::thread::sleep(Duration::from_millis(50));
        held.release().unwrap();
        t.join().unwrap()
    });
    waited.expect("lock after a wait").release().unwrap();
}

#[test]
fn a_certificate_that_does_not_verify_is_a_config_error_and_nothing_is_run() {
    let Some((server, tls_port)) = tls_server("server", false, &[]) else {
        return;
    };
    reset_stats(server.addr());
    // No CA given: the system's roots do not know the test's CA.
    let started = Instant::now();
    let result = Client::builder()
        .nodes([format!("rediss://127.0.0.1:{tls_port}")])
        .build();
    match tls_failure(result, started) {
        TlsFailure::Certificate(why) => assert!(why.contains("UnknownIssuer"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(commands_run(server.addr(), None), "config|resetstat");
}

#[test]
fn a_name_that_does_not_match_is_a_config_error() {
    let Some((server, tls_port)) = tls_server("elsewhere", false, &[]) else {
        return;
    };
    reset_stats(server.addr());
    let started = Instant::now();
    let result = trusting()
        .nodes([format!("rediss://127.0.0.1:{tls_port}")])
        .build();
    assert!(
        matches!(tls_failure(result, started), TlsFailure::NameMismatch(_)),
        "expected a name mismatch"
    );
    assert_eq!(commands_run(server.addr(), None), "config|resetstat");
}

#[test]
fn a_plaintext_port_on_a_tls_url_and_the_reverse_are_config_errors() {
    let Some((server, tls_port)) = tls_server("server", false, &["--requirepass", "pw"]) else {
        return;
    };
    let plain = server.port();
    // A plaintext Redis never answers a TLS hello: the handshake is given up at the connect
    // timeout (500 ms here), and that is what it means.
    let started = Instant::now();
    let result = trusting()
        .nodes([format!("rediss://:pw@127.0.0.1:{plain}")])
        .build();
    assert_eq!(tls_failure(result, started), TlsFailure::NotTls);

    // A TLS port closes a plaintext connection at its first bytes, and answers TLS.
    let started = Instant::now();
    let result = Client::builder()
        .nodes([format!("redis://:pw@127.0.0.1:{tls_port}")])
        .build();
    assert_eq!(tls_failure(result, started), TlsFailure::TlsPort);

    // Among nodes that are only down, it is still the one configuration error.
    let result = Client::builder()
        .nodes([
            format!("redis://:pw@127.0.0.1:{tls_port}"),
            format!("redis://127.0.0.1:{}", free_port().unwrap()),
            format!("redis://127.0.0.1:{}", free_port().unwrap()),
        ])
        .build();
    match result {
        Ok(c) => panic!("{:?}", c.try_lock("x", Duration::from_secs(1)).map(|_| ())),
        r => assert_eq!(tls_failure(r, Instant::now()), TlsFailure::TlsPort),
    }
}

#[test]
fn a_server_that_wants_a_client_certificate_refuses_a_client_without_one() {
    let Some((server, tls_port)) = tls_server("server", true, &[]) else {
        return;
    };
    reset_stats(server.addr());
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let started = Instant::now();
    let result = trusting().nodes([&url]).build();
    assert!(
        matches!(
            tls_failure(result, started),
            TlsFailure::ClientCertificate(_) | TlsFailure::Handshake(_)
        ),
        "expected a refused client"
    );
    assert_eq!(commands_run(server.addr(), None), "config|resetstat");

    let pki = pki();
    let client = trusting()
        .tls_client_cert(pki.file("client.crt"), pki.file("client.key"))
        .nodes([&url])
        .build()
        .expect("with a client certificate");
    client
        .try_lock("tls:mutual", Duration::from_secs(5))
        .expect("lock")
        .release()
        .expect("release");
}

#[test]
fn unusable_tls_files_are_refused_by_build() {
    let pki = pki();
    let missing = pki.file("no-such-ca.crt");
    match Client::builder()
        .nodes(["rediss://127.0.0.1:1"])
        .tls_ca_file(&missing)
        .build()
    {
        Err(Error::InvalidArgument(InvalidArgument::BadTlsFile { path, .. })) => {
            assert_eq!(path, missing.display().to_string())
        }
        other => panic!("{other:?}"),
    }
    // A key is no certificate.
    match Client::builder()
        .nodes(["rediss://127.0.0.1:1"])
        .tls_client_cert(pki.file("client.key"), pki.file("client.key"))
        .build()
    {
        Err(Error::InvalidArgument(InvalidArgument::BadTlsFile { reason, .. })) => {
            assert!(reason.contains("no PEM certificate"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

/// A Redis Cluster over TLS (`--tls-cluster yes`) of two masters, each with a certificate for its
/// own address only: `node1` on 127.0.0.1 (slots 0-8191), `node2` announcing 127.0.0.2 (slots
/// 8192-16383; bound to 127.0.0.1 too, for the plaintext probes). Each with its TLS port. `None`
/// when the binary has no TLS.
fn tls_cluster() -> Option<[(RedisServer, u16); 2]> {
    let bus = [free_port().unwrap(), free_port().unwrap()].map(|p| p.to_string());
    let node = |cert: &str, bus: &str, ip: &'static [&'static str]| {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            "--tls-cluster",
            "yes",
            "--cluster-port",
            bus,
        ];
        args.extend(ip);
        tls_server(cert, false, &args)
    };
    let a = node("node1", &bus[0], &["--cluster-announce-ip", "127.0.0.1"])?;
    let b = node(
        "node2",
        &bus[1],
        &[
            "--bind",
            "127.0.0.1",
            "127.0.0.2",
            "--cluster-announce-ip",
            "127.0.0.2",
        ],
    )?;
    let ok = |v: Value| assert!(matches!(v, Value::Simple(_)), "{}", show(&v));
    ok(cmd(
        a.0.addr(),
        &[b"CLUSTER", b"ADDSLOTSRANGE", b"0", b"8191"],
    ));
    ok(cmd(
        b.0.addr(),
        &[b"CLUSTER", b"ADDSLOTSRANGE", b"8192", b"16383"],
    ));
    ok(cmd(
        a.0.addr(),
        &[
            b"CLUSTER",
            b"MEET",
            b"127.0.0.2",
            b.1.to_string().as_bytes(),
            bus[1].as_bytes(),
        ],
    ));
    let agreed = eventually(Duration::from_secs(20), || {
        [&a, &b].iter().all(|(s, _)| {
            let info = cmd(s.addr(), &[b"CLUSTER", b"INFO"]);
            let text = show(&info);
            text.contains("cluster_state:ok") && text.contains("cluster_known_nodes:2")
        })
    });
    assert!(agreed, "the TLS cluster did not form");
    Some([a, b])
}

/// Keys of the cluster's two masters: one in slots 0-8191, one in 8192-16383.
fn keys_of_both(at: std::net::SocketAddr) -> [String; 2] {
    let slot = |k: &str| match cmd(at, &[b"CLUSTER", b"KEYSLOT", k.as_bytes()]) {
        Value::Integer(n) => n,
        other => panic!("KEYSLOT: {}", show(&other)),
    };
    let find = |low: bool| {
        (0..1000)
            .map(|i| format!("tls:cluster:{i}"))
            .find(|k| (slot(k) < 8192) == low)
            .unwrap()
    };
    [find(true), find(false)]
}

/// Locks on both masters of the TLS cluster work, the key on the master of its slot while held
/// and gone after the release.
fn lock_on_both(client: &Client, servers: &[(RedisServer, u16); 2]) {
    let keys = keys_of_both(servers[0].0.addr());
    for (key, (server, _)) in keys.iter().zip(servers) {
        let lock = client
            .try_lock(key, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("lock {key}: {e:?}"));
        assert!(
            get(server.addr(), key.as_bytes()).is_some(),
            "{key} is on its master"
        );
        lock.release().expect("release");
        assert!(
            get(server.addr(), key.as_bytes()).is_none(),
            "{key} released"
        );
    }
}

/// `rediss+cluster://`: each master is checked against the name the cluster announces for it
/// (its IP here), not against the seed's: a cluster whose nodes have certificates of their own
/// works.
#[test]
fn each_cluster_master_is_checked_against_its_own_name() {
    let Some(servers) = tls_cluster() else {
        return;
    };
    let url = format!("rediss+cluster://127.0.0.1:{}", servers[0].1);
    let client = trusting()
        .nodes([url])
        .build()
        .unwrap_or_else(|e| panic!("a TLS cluster with a certificate per node: {e:?}"));
    lock_on_both(&client, &servers);
}

/// Each seed of a `rediss+cluster://` URL is checked against its own host, and a seed that fails
/// its TLS handshake moves the walk on to the next: `localhost` on `node2`'s port (a certificate
/// for 127.0.0.2 only) fails, `127.0.0.1` on `node1`'s is the seed.
#[test]
fn a_cluster_seed_that_fails_its_tls_check_moves_on_to_the_next() {
    let Some(servers) = tls_cluster() else {
        return;
    };
    let url = format!(
        "rediss+cluster://localhost:{},127.0.0.1:{}",
        servers[1].1, servers[0].1
    );
    let client = trusting()
        .nodes([url])
        .build()
        .unwrap_or_else(|e| panic!("the second seed verifies: {e:?}"));
    lock_on_both(&client, &servers);
}
