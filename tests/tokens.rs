//! Every attempt of an acquisition sets its own token, so that nothing sent for an earlier,
//! lost attempt (its cleanup above all) can touch what a later attempt holds.

mod common;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::Client;

const TTL: Duration = Duration::from_secs(10);

/// A `MONITOR` connection to one node: the commands that node runs, as their arguments.
struct Monitor {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Monitor {
    fn start(addr: SocketAddr) -> Monitor {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut m = Monitor {
            stream,
            buf: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !m.buf.starts_with(b"+OK\r\n") {
            assert!(Instant::now() < deadline, "MONITOR was not confirmed");
            m.fill();
        }
        m.buf.drain(..5);
        m
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) => panic!("the MONITOR connection closed"),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("MONITOR: {e}"),
        }
    }

    /// The commands clients sent (not those that scripts ran) and that arrived so far.
    fn commands(&mut self) -> Vec<Vec<Vec<u8>>> {
        self.fill();
        let mut out = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
            let line: Vec<u8> = self.buf.drain(..end + 2).take(end).collect();
            // `+<time> [<db> <client>] "arg" "arg" ...`; scripts' commands say `lua`.
            let Some(close) = line.iter().position(|&b| b == b']') else {
                continue;
            };
            if line[..close].ends_with(b"lua") {
                continue;
            }
            out.push(parse_args(&line[close + 1..]));
        }
        out
    }
}

/// The quoted arguments of a `MONITOR` line, unescaped.
fn parse_args(s: &[u8]) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut arg = Vec::new();
        while i < s.len() && s[i] != b'"' {
            if s[i] == b'\\' && i + 1 < s.len() {
                i += 1;
                match s[i] {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' if i + 2 < s.len() => {
                        let hex = std::str::from_utf8(&s[i + 1..i + 3]).unwrap();
                        arg.push(u8::from_str_radix(hex, 16).unwrap());
                        i += 2;
                    }
                    other => arg.push(other),
                }
            } else {
                arg.push(s[i]);
            }
            i += 1;
        }
        args.push(arg);
        i += 1;
    }
    args
}

/// Arguments of a command, as `MONITOR` shows them.
type Args = [Vec<u8>];

/// The keys and arguments of an `EVAL` or `EVALSHA`.
/// The SHA1 of the fenced grant's write-back script, as `EVALSHA` names it.
fn fence_write_sha() -> Vec<u8> {
    redlock_mux::internals::FENCE_WRITE.sha.to_vec()
}

fn eval_parts(args: &Args) -> Option<(&Args, &Args)> {
    let name = args.first()?.to_ascii_uppercase();
    if name != b"EVAL" && name != b"EVALSHA" {
        return None;
    }
    let n: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
    let rest = args.get(3..)?;
    (rest.len() >= n).then(|| rest.split_at(n))
}

/// Which lock kind a waiter takes, and how to read its attempts off a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    All,
    Fenced,
}

impl Kind {
    fn key(self) -> String {
        format!("tokens:{self:?}")
    }

    fn all_keys(self) -> [String; 2] {
        [format!("{}:a", self.key()), format!("{}:b", self.key())]
    }

    /// The token that an acquire command of this kind sets, if `args` is one.
    fn attempt_token(self, args: &[Vec<u8>]) -> Option<Vec<u8>> {
        let key = self.key().into_bytes();
        match self {
            Kind::Mutex => {
                (args.len() >= 3 && args[0].eq_ignore_ascii_case(b"SET") && args[1] == key)
                    .then(|| args[2].clone())
            }
            Kind::Read | Kind::Write => {
                // On Redis 8 without Lua: a reader is a field of a hash at the writer key
                // (`HSETEX W PX ttl FIELDS 1 token 1`), a writer's `SET W token NX PX ttl`.
                let writer = format!("{{rw:{}}}:w", self.key()).into_bytes();
                let native: &[u8] = if self == Kind::Read {
                    b"HSETEX"
                } else {
                    b"SET"
                };
                if args.len() >= 3 && args[0].eq_ignore_ascii_case(native) && args[1] == writer {
                    let at = if self == Kind::Read { 6 } else { 2 };
                    return args.get(at).cloned();
                }
                // Fair or not: the writer key, then the reader set.
                let (keys, argv) = eval_parts(args)?;
                let writer = format!("{{rw:{}}}:w", self.key()).into_bytes();
                let readers = format!("{{rw:{}}}:r", self.key()).into_bytes();
                (keys.len() >= 3 && keys[0] == writer && keys[1] == readers)
                    .then(|| argv[0].clone())
            }
            Kind::All => {
                let (keys, argv) = eval_parts(args)?;
                let set = self.all_keys();
                (keys.len() == 2 && keys[0] == set[0].as_bytes() && argv.len() == 2)
                    .then(|| argv[0].clone())
            }
            Kind::Fenced => {
                // The write-back of a fenced grant has the same keys and token: it is told
                // apart by its script, sent by body or by SHA1.
                let script = args.get(1)?;
                if *script == redlock_mux::internals::FENCE_WRITE.body.as_bytes()
                    || *script == fence_write_sha()
                {
                    return None;
                }
                let (keys, argv) = eval_parts(args)?;
                (keys.len() == 2 && keys[0] == key && keys[1].starts_with(b"redlock-mux:fence:"))
                    .then(|| argv[0].clone())
            }
        }
    }
}

/// Someone else holds what a waiter of `kind` wants, until the guard returned is dropped.
fn hold_against(client: &Client, kind: Kind) -> Box<dyn std::any::Any> {
    match kind {
        Kind::Mutex | Kind::Fenced => Box::new(client.lock(kind.key(), TTL).unwrap()),
        Kind::All => Box::new(client.lock(&kind.all_keys()[1], TTL).unwrap()),
        Kind::Read => Box::new(client.write_lock(kind.key(), TTL).unwrap()),
        Kind::Write => Box::new(client.read_lock(kind.key(), TTL).unwrap()),
    }
}

/// Takes a lock of `kind`, waiting; returns the guard's token once it has been released.
fn take(client: &Client, kind: Kind) -> Vec<u8> {
    let key = kind.key();
    match kind {
        Kind::Mutex => {
            let g = client.lock(&key, TTL).unwrap();
            let t = g.token().to_vec();
            g.release().unwrap();
            t
        }
        Kind::Read => {
            let g = client.read_lock(&key, TTL).unwrap();
            let t = g.token().to_vec();
            g.release().unwrap();
            t
        }
        Kind::Write => {
            let g = client.write_lock(&key, TTL).unwrap();
            let t = g.token().to_vec();
            g.release().unwrap();
            t
        }
        Kind::All => {
            let g = client.lock_all(kind.all_keys(), TTL).unwrap();
            let t = g.token().to_vec();
            g.release().unwrap();
            t
        }
        Kind::Fenced => {
            let g = client.lock_fenced(&key, TTL).unwrap();
            let t = g.token().to_vec();
            g.release().unwrap();
            t
        }
    }
}

/// A waiter that loses several attempts sends a new token with each one, for every kind of
/// lock, and its guard carries the token of the attempt that won.
#[test]
fn every_attempt_of_every_lock_kind_sets_its_own_token() {
    let cluster = RedisCluster::start(3).unwrap();
    let holder_client = Client::new(cluster.urls()).unwrap();
    let waiter = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut failures = Vec::new();
    for kind in [
        Kind::Mutex,
        Kind::Read,
        Kind::Write,
        Kind::All,
        Kind::Fenced,
    ] {
        let holder = hold_against(&holder_client, kind);
        if kind == Kind::Fenced {
            // One node's counter ahead of the others': the won attempt's counters disagree,
            // and the largest is written back (with the won attempt's token) before the
            // guard is handed out. That write-back is no attempt.
            set(
                cluster.addrs()[1],
                b"redlock-mux:fence:{tokens:Fenced}",
                b"100",
            );
        }
        let mut monitor = Monitor::start(cluster.addrs()[0]);
        let w = waiter.clone();
        let t = thread::spawn(move || take(&w, kind));
        // Several lost attempts: the backstop retries come every 10-30 ms.
        thread::sleep(Duration::from_millis(250));
        drop(holder);
        let token = t.join().unwrap();
        let mut attempts = Vec::new();
        let seen = eventually(Duration::from_secs(5), || {
            for args in monitor.commands() {
                attempts.extend(kind.attempt_token(&args));
            }
            attempts.last() == Some(&token)
        });
        let shown: Vec<String> = attempts
            .iter()
            .take(4)
            .map(|t| String::from_utf8_lossy(&t[..t.len().min(8)]).into_owned())
            .collect();
        let mut distinct = attempts.clone();
        distinct.sort();
        distinct.dedup();
        if !seen || attempts.len() < 3 || distinct.len() != attempts.len() {
            failures.push(format!(
                "{kind:?}: {} attempts, {} distinct tokens, the guard's token last: {seen}; first ones {shown:?}",
                attempts.len(),
                distinct.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A fair, write-preferring writer that loses several attempts sends a new token with each,
/// yet keeps one place in the queue and one intent on every node, and leaves neither behind.
#[test]
fn a_fair_waiter_keeps_one_queue_entry_and_one_intent_across_its_attempts() {
    let cluster = RedisCluster::start(3).unwrap();
    let kind = Kind::Write;
    let key = kind.key();
    let holder = Client::new(cluster.urls())
        .unwrap()
        .read_lock(&key, TTL)
        .unwrap();
    let waiter = Client::builder()
        .nodes(cluster.urls())
        .fair(true)
        .rw_policy(redlock_mux::RwPolicy::WritePreferring)
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut monitor = Monitor::start(cluster.addrs()[0]);
    let t = thread::spawn(move || take(&waiter, kind));
    let mut attempts = Vec::new();
    let several = eventually(Duration::from_secs(5), || {
        for args in monitor.commands() {
            attempts.extend(kind.attempt_token(&args));
        }
        attempts.len() >= 5
    });
    assert!(several, "only {} attempts", attempts.len());
    let queue = format!("{{rw:{key}}}:q").into_bytes();
    let intents = format!("{{rw:{key}}}:wi").into_bytes();
    let zcard = |addr, set: &[u8]| cmd(addr, &[b"ZCARD", set]);
    for addr in cluster.addrs() {
        assert_settles_eq!(zcard(addr, &queue), redlock_mux::resp::Value::Integer(1));
        assert_settles_eq!(zcard(addr, &intents), redlock_mux::resp::Value::Integer(1));
    }
    holder.release().unwrap();
    let token = t.join().unwrap();
    let seen = eventually(Duration::from_secs(5), || {
        for args in monitor.commands() {
            attempts.extend(kind.attempt_token(&args));
        }
        attempts.last() == Some(&token)
    });
    assert!(seen, "the guard's token is the last attempt's");
    let mut distinct = attempts.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), attempts.len(), "a token was used twice");
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
}

/// A TCP relay in front of one node that can hold back what clients send: held bytes stay in
/// the relay, the client side of their connections can be cut, and they are delivered later,
/// on the server connections they came for (a write that was already on its way when the
/// client gave its connection up).
struct Relay {
    addr: SocketAddr,
    shared: Arc<RelayShared>,
    accept: Option<JoinHandle<()>>,
}

struct RelayShared {
    upstream: SocketAddr,
    hold: AtomicBool,
    stop: AtomicBool,
    links: Mutex<Vec<Arc<Link>>>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

struct Link {
    client: TcpStream,
    server: TcpStream,
    held: Mutex<Vec<u8>>,
    cut: AtomicBool,
}

const RELAY_POLL: Duration = Duration::from_millis(5);

impl Relay {
    fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(RelayShared {
            upstream,
            hold: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            links: Mutex::new(Vec::new()),
            pumps: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => s.link(client),
                    Err(_) => thread::sleep(RELAY_POLL),
                }
            }
        });
        Relay {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// From now on, what clients send is kept in the relay.
    fn hold(&self) {
        self.shared.hold.store(true, Ordering::SeqCst);
    }

    /// Everything held so far, over all connections.
    fn held(&self) -> Vec<u8> {
        let links = self.shared.links.lock().unwrap();
        links
            .iter()
            .flat_map(|l| l.held.lock().unwrap().clone())
            .collect()
    }

    /// Closes the client side of every connection with something held, and lets everything
    /// through from now on.
    fn cut_held_and_pass(&self) {
        for l in self.shared.links.lock().unwrap().iter() {
            if !l.held.lock().unwrap().is_empty() {
                l.cut.store(true, Ordering::SeqCst);
                let _ = l.client.shutdown(Shutdown::Both);
            }
        }
        self.shared.hold.store(false, Ordering::SeqCst);
    }

    /// Delivers what the cut connections held to the node, and waits until the node has run it.
    fn deliver_held(&self) {
        let links: Vec<Arc<Link>> = self.shared.links.lock().unwrap().clone();
        for l in links.iter().filter(|l| l.cut.load(Ordering::SeqCst)) {
            let mut held = std::mem::take(&mut *l.held.lock().unwrap());
            held.extend_from_slice(b"PING\r\n");
            let mut server = &l.server;
            server.write_all(&held).unwrap();
            // The replies are read by the link's own pump; give the node time to run it all.
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while links
            .iter()
            .any(|l| l.cut.load(Ordering::SeqCst) && !l.server_done())
        {
            assert!(
                Instant::now() < deadline,
                "the node did not answer the held commands"
            );
            thread::sleep(RELAY_POLL);
        }
    }
}

impl Link {
    /// Whether the node answered the `PING` that follows the held commands (a cut link keeps
    /// its replies in `held`, which is empty until then).
    fn server_done(&self) -> bool {
        let h = self.held.lock().unwrap();
        h.ends_with(b"PONG\r\n") || h.windows(4).any(|w| w == b"pong")
    }
}

impl RelayShared {
    fn link(self: &Arc<Self>, client: TcpStream) {
        let Ok(server) = TcpStream::connect(self.upstream) else {
            return;
        };
        for s in [&client, &server] {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(RELAY_POLL)).unwrap();
            s.set_nodelay(true).unwrap();
        }
        let link = Arc::new(Link {
            client,
            server,
            held: Mutex::new(Vec::new()),
            cut: AtomicBool::new(false),
        });
        self.links.lock().unwrap().push(link.clone());
        let (up, down) = (self.clone(), self.clone());
        let (l1, l2) = (link.clone(), link);
        let mut pumps = self.pumps.lock().unwrap();
        pumps.push(thread::spawn(move || up.pump_up(&l1)));
        pumps.push(thread::spawn(move || down.pump_down(&l2)));
    }

    /// Client to node: forwarded, or held while holding.
    fn pump_up(&self, l: &Link) {
        let mut buf = [0u8; 16 * 1024];
        while !self.stop.load(Ordering::SeqCst) && !l.cut.load(Ordering::SeqCst) {
            let n = match (&l.client).read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            };
            if self.hold.load(Ordering::SeqCst) {
                l.held.lock().unwrap().extend_from_slice(&buf[..n]);
            } else if (&l.server).write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }

    /// Node to client; on a cut link, the replies are kept in `held` instead.
    fn pump_down(&self, l: &Link) {
        let mut buf = [0u8; 16 * 1024];
        while !self.stop.load(Ordering::SeqCst) {
            let n = match (&l.server).read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            };
            if l.cut.load(Ordering::SeqCst) {
                l.held.lock().unwrap().extend_from_slice(&buf[..n]);
            } else if (&l.client).write_all(&buf[..n]).is_err() {
                let _ = l.server.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        for l in self.shared.links.lock().unwrap().iter() {
            let _ = l.client.shutdown(Shutdown::Both);
            let _ = l.server.shutdown(Shutdown::Both);
        }
        for p in std::mem::take(&mut *self.shared.pumps.lock().unwrap()) {
            let _ = p.join();
        }
    }
}

/// The cleanup of a lost attempt, written to a connection that the client then gave up, still
/// reaches the node, after a later attempt of the same waiter took the lock there. It must not
/// release that later attempt's hold.
#[test]
fn a_lost_attempts_late_cleanup_cannot_release_a_later_attempt() {
    let cluster = RedisCluster::start(3).unwrap();
    let addrs = cluster.addrs();
    let relay = Relay::start(addrs[0]);
    let urls = vec![
        relay.url(),
        cluster.urls()[1].clone(),
        cluster.urls()[2].clone(),
    ];
    let waiter = Client::builder()
        .nodes(&urls)
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(30))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let key = b"late-cleanup";
    // Someone else holds nodes 1 and 2, so every attempt is refused there.
    for &addr in &addrs[1..] {
        cmd(addr, &[b"SET", key, b"other", b"PX", b"30000"]);
    }
    // Node 0 takes each attempt only later: what the waiter sends it is held in the relay.
    relay.hold();
    let (tx, rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let lock = waiter.lock("late-cleanup", TTL).unwrap();
        tx.send(lock.token().to_vec()).unwrap();
        release_rx.recv().unwrap();
        lock.release().unwrap();
    });
    // Two attempts and their cleanups are held.
    let held = eventually(Duration::from_secs(5), || {
        relay.held().windows(key.len()).filter(|w| w == key).count() >= 4
    });
    assert!(held, "the waiter's attempts did not reach the relay");
    // The waiter's connection to node 0 breaks; what it sent there is still on its way.
    relay.cut_held_and_pass();
    // Node 1 frees up: a later attempt wins on nodes 0 (reconnected) and 1.
    cmd(addrs[1], &[b"DEL", key]);
    let token = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert_eq!(
        get(addrs[0], key),
        Some(token.clone()),
        "node 0 holds the guard's token"
    );
    // The earlier attempts' commands arrive.
    relay.deliver_held();
    let on_node_0 = get(addrs[0], key);
    release_tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(
        on_node_0.map(|v| String::from_utf8_lossy(&v).into_owned()),
        Some(String::from_utf8_lossy(&token).into_owned()),
        "a late cleanup released the lock that a later attempt holds on node 0"
    );
}
