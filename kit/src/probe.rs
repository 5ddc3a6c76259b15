//! What the tests of every package use to look at a server (feature `probe`).
//!
//! - [`cmd`] and friends are a tiny blocking RESP client for assertions
//!   about what the library left on a server.
//! - [`FakeServer`] is a scripted fake used only for paths that no
//!   installable redis-server supports (e.g. Redis 8.4 `DELEX`) and for
//!   hostile or garbled replies; all other tests use real redis-server.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redlock_mux::resp::{self, Limits, Status, Value};

/// Read and write timeout of the assertion client.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest reply the assertion client buffers before giving up.
const MAX_REPLY: usize = 64 << 20;

/// Sends one command on a fresh connection and returns the reply. Panics on
/// any I/O or protocol error (5 s timeouts), naming the command.
pub fn cmd(addr: SocketAddr, args: &[&[u8]]) -> Value {
    try_cmd(addr, args, CLIENT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{} on {addr}: {e}", describe(args)))
}

/// Like [`cmd`], but first authenticates with `AUTH password` on the same
/// connection; panics if that is refused.
pub fn cmd_auth(addr: SocketAddr, password: &str, args: &[&[u8]]) -> Value {
    let run = || -> io::Result<Value> {
        let mut conn = Conn::connect(addr, CLIENT_TIMEOUT)?;
        let auth = conn.call(&[b"AUTH", password.as_bytes()])?;
        if auth != Value::Simple(b"OK".to_vec()) {
            return Err(io::Error::other(format!("AUTH refused: {}", show(&auth))));
        }
        conn.call(args)
    };
    run().unwrap_or_else(|e| panic!("{} on {addr}: {e}", describe(args)))
}

/// Sends one command on a fresh connection with `timeout` for connecting,
/// writing and reading; errors are returned, not panicked on.
pub fn try_cmd(addr: SocketAddr, args: &[&[u8]], timeout: Duration) -> io::Result<Value> {
    Conn::connect(addr, timeout)?.call(args)
}

/// Sends several commands, in order, on one fresh connection (e.g. `AUTH`,
/// `SELECT`, then a query) and returns every reply. Panics on I/O errors.
pub fn cmds(addr: SocketAddr, commands: &[&[&[u8]]]) -> Vec<Value> {
    let run = || -> io::Result<Vec<Value>> {
        let mut conn = Conn::connect(addr, CLIENT_TIMEOUT)?;
        commands.iter().map(|args| conn.call(args)).collect()
    };
    run().unwrap_or_else(|e| panic!("command sequence on {addr}: {e}"))
}

/// Polls `check` every 5 ms until it returns true or `timeout` passes;
/// returns its last answer. For effects that the library sends but does
/// not wait for (the nodes outside the quorum, the cleanup after a lost
/// attempt), which a fresh connection may overtake.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// How long [`assert_settles!`] and [`assert_settles_eq!`] wait.
pub const SETTLE: Duration = Duration::from_secs(2);

/// `assert!` for the state of every node right after a lock call: the call returns once a
/// quorum answered, and the last node may run its command moments later (a fresh assertion
/// connection can overtake it on a busy machine). Polls the condition every 5 ms for
/// [`SETTLE`], then asserts it one last time.
#[macro_export]
macro_rules! assert_settles {
    ($cond:expr $(, $($arg:tt)+)?) => {{
        let deadline = std::time::Instant::now() + $crate::probe::SETTLE;
        while !($cond) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!($cond $(, $($arg)+)?);
    }};
}

/// `assert_eq!` that waits for the last node, as [`assert_settles!`] does.
#[macro_export]
macro_rules! assert_settles_eq {
    ($left:expr, $right:expr $(, $($arg:tt)+)?) => {{
        let deadline = std::time::Instant::now() + $crate::probe::SETTLE;
        while ($left) != ($right) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!($left, $right $(, $($arg)+)?);
    }};
}

/// All keys (`KEYS *`), sorted.
pub fn keys(addr: SocketAddr) -> Vec<Vec<u8>> {
    match cmd(addr, &[b"KEYS", b"*"]) {
        Value::Array(Some(items)) => {
            let mut keys: Vec<Vec<u8>> = items
                .into_iter()
                .map(|item| match item {
                    Value::Bulk(Some(key)) => key,
                    other => panic!("KEYS * on {addr}: unexpected item {}", show(&other)),
                })
                .collect();
            keys.sort();
            keys
        }
        other => panic!("KEYS * on {addr}: unexpected reply {}", show(&other)),
    }
}

/// `DBSIZE`.
pub fn dbsize(addr: SocketAddr) -> i64 {
    integer(addr, &[b"DBSIZE"])
}

/// `GET key`; `None` when the key does not exist.
pub fn get(addr: SocketAddr, key: &[u8]) -> Option<Vec<u8>> {
    match cmd(addr, &[b"GET", key]) {
        Value::Bulk(value) => value,
        other => panic!("GET on {addr}: unexpected reply {}", show(&other)),
    }
}

/// `PTTL key`: milliseconds left, -1 without expiry, -2 when missing.
pub fn pttl(addr: SocketAddr, key: &[u8]) -> i64 {
    integer(addr, &[b"PTTL", key])
}

/// `SET key value`; panics unless the reply is `+OK`.
pub fn set(addr: SocketAddr, key: &[u8], value: &[u8]) {
    expect_ok(addr, &[b"SET", key, value]);
}

/// `FLUSHALL`; panics unless the reply is `+OK`.
pub fn flushall(addr: SocketAddr) {
    expect_ok(addr, &[b"FLUSHALL"]);
}

fn integer(addr: SocketAddr, args: &[&[u8]]) -> i64 {
    match cmd(addr, args) {
        Value::Integer(n) => n,
        other => panic!(
            "{} on {addr}: unexpected reply {}",
            describe(args),
            show(&other)
        ),
    }
}

fn expect_ok(addr: SocketAddr, args: &[&[u8]]) {
    let reply = cmd(addr, args);
    assert_eq!(
        reply,
        Value::Simple(b"OK".to_vec()),
        "{} on {addr}: {}",
        describe(args),
        show(&reply)
    );
}

/// The command name, for panic messages (arguments may be binary or long).
fn describe(args: &[&[u8]]) -> String {
    args.first().map_or_else(
        || "empty command".into(),
        |name| String::from_utf8_lossy(name).into_owned(),
    )
}

/// A reply in readable form for panic messages.
pub fn show(value: &Value) -> String {
    let text = |b: &[u8]| format!("{:?}", String::from_utf8_lossy(b));
    match value {
        Value::Simple(s) => format!("+{}", text(s)),
        Value::Error(e) => format!("-{}", text(e)),
        Value::Integer(n) => format!(":{n}"),
        Value::Bulk(None) | Value::Array(None) => "(nil)".into(),
        Value::Bulk(Some(b)) => text(b),
        Value::Array(Some(items)) => {
            let items: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
    }
}

/// One blocking connection of the assertion client.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    fn call(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        let mut out = Vec::new();
        resp::encode_command(&mut out, args);
        self.stream.write_all(&out)?;
        let limits = Limits::default();
        loop {
            let decoded = match resp::decode(&self.buf, &limits) {
                Ok(Status::Complete((reply, used))) => Some((reply.to_value(), used)),
                Ok(Status::Partial) => None,
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("undecodable reply: {e:?}"),
                    ))
                }
            };
            if let Some((value, used)) = decoded {
                self.buf.drain(..used);
                return Ok(value);
            }
            if self.buf.len() > MAX_REPLY {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "reply too long"));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = match self.stream.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// What a [`FakeServer`] does with one received command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeReply {
    /// Write these raw bytes back (any bytes: valid RESP, garbage, a
    /// truncated or an oversized reply).
    Bytes(Vec<u8>),
    /// Close the connection without answering.
    Close,
    /// Write these bytes (typically the start of a reply), then close.
    BytesThenClose(Vec<u8>),
    /// Answer nothing and keep the connection open (a hung server).
    Silent,
}

impl FakeReply {
    /// A simple-string reply, `+text\r\n`.
    pub fn simple(text: &str) -> FakeReply {
        FakeReply::Bytes(format!("+{text}\r\n").into_bytes())
    }

    /// An error reply, `-text\r\n`.
    pub fn error(text: &str) -> FakeReply {
        FakeReply::Bytes(format!("-{text}\r\n").into_bytes())
    }

    /// An integer reply, `:n\r\n`.
    pub fn integer(n: i64) -> FakeReply {
        FakeReply::Bytes(format!(":{n}\r\n").into_bytes())
    }

    /// A bulk-string reply, or the nil bulk string for `None`.
    pub fn bulk(value: Option<&[u8]>) -> FakeReply {
        match value {
            None => FakeReply::Bytes(b"$-1\r\n".to_vec()),
            Some(v) => {
                let mut out = format!("${}\r\n", v.len()).into_bytes();
                out.extend_from_slice(v);
                out.extend_from_slice(b"\r\n");
                FakeReply::Bytes(out)
            }
        }
    }
}

type Handler = dyn Fn(&[Vec<u8>]) -> FakeReply + Send + Sync + 'static;

/// How often the fake's threads look at the stop flag.
const FAKE_POLL: Duration = Duration::from_millis(20);

/// A scripted TCP server on 127.0.0.1 that answers each command (a RESP
/// array of bulk strings, decoded with the crate's codec) with whatever the
/// handler returns. Connections are served concurrently; everything stops
/// when the `FakeServer` is dropped.
pub struct FakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Binds a free port and starts serving with `handler`.
    pub fn start<F>(handler: F) -> io::Result<FakeServer>
    where
        F: Fn(&[Vec<u8>]) -> FakeReply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            thread::Builder::new()
                .name(format!("fake-redis-{}", addr.port()))
                .spawn(move || accept_loop(listener, handler, stop, log))?
        };
        Ok(FakeServer {
            addr,
            stop,
            log,
            thread: Some(thread),
        })
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Every command received so far, over all connections, in order.
    pub fn commands(&self) -> Vec<Vec<Vec<u8>>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Every thread notices the flag within FAKE_POLL (or its write
        // timeout), so this join is bounded.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    handler: Arc<Handler>,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (handler, stop, log) = (handler.clone(), stop.clone(), log.clone());
                if let Ok(t) = thread::Builder::new()
                    .name("fake-redis-conn".into())
                    .spawn(move || serve(stream, &*handler, &stop, &log))
                {
                    connections.push(t);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(FAKE_POLL),
            Err(_) => thread::sleep(FAKE_POLL),
        }
        connections.retain(|t| !t.is_finished());
    }
    for t in connections {
        let _ = t.join();
    }
}

fn serve(
    mut stream: TcpStream,
    handler: &Handler,
    stop: &AtomicBool,
    log: &Mutex<Vec<Vec<Vec<u8>>>>,
) {
    // Accepted sockets may inherit non-blocking mode from the listener.
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(Some(FAKE_POLL)).is_err()
        || stream
            .set_write_timeout(Some(Duration::from_secs(2)))
            .is_err()
    {
        return;
    }
    let limits = Limits::default();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        // Answer every complete command in the buffer.
        loop {
            let decoded = match resp::decode(&buf, &limits) {
                Ok(Status::Complete((reply, used))) => (reply.to_value(), used),
                Ok(Status::Partial) => break,
                Err(_) => return, // not RESP: hang up
            };
            let (value, used) = decoded;
            buf.drain(..used);
            let Some(args) = command_args(value) else {
                return;
            };
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(args.clone());
            match handler(&args) {
                FakeReply::Bytes(bytes) => {
                    if write_bounded(&mut stream, &bytes, stop).is_err() {
                        return;
                    }
                }
                FakeReply::Close => {
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
                FakeReply::BytesThenClose(bytes) => {
                    let _ = write_bounded(&mut stream, &bytes, stop);
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
                FakeReply::Silent => {}
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Writes all of `bytes` unless the fake is stopped or the peer stops
/// reading for the write timeout (so a huge reply cannot hang `Drop`).
fn write_bounded(stream: &mut TcpStream, bytes: &[u8], stop: &AtomicBool) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rest = bytes;
    while !rest.is_empty() {
        if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match stream.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A client command is a non-empty array of bulk strings.
fn command_args(value: Value) -> Option<Vec<Vec<u8>>> {
    match value {
        Value::Array(Some(items)) if !items.is_empty() => items
            .into_iter()
            .map(|item| match item {
                Value::Bulk(Some(arg)) => Some(arg),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}
