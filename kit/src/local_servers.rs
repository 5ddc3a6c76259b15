//! Local `redis-server` processes for tests, benchmarks and the CLI.
//!
//! Std only: used by the integration tests, the engine's simulation, the
//! benches and the `redlock-mux` command (`cli/`, whose `bench` starts
//! local servers).
//!
//! Every server listens on 127.0.0.1 on a free port, keeps its data, its
//! log and its stderr in a private temporary directory and runs in the
//! foreground as a child of this process (nothing here daemonizes).
//!
//! Cleanup:
//! - [`RedisServer`]'s `Drop` kills the server by PID, reaps it and removes
//!   its directory. `Drop` also runs while a panicking test unwinds, so a
//!   failed assertion does not leak servers.
//! - If this process dies without unwinding (SIGKILL, `abort`, a timeout in
//!   the test runner), a small `sh` watchdog started next to every server
//!   notices that its stdin pipe from us was closed by the kernel and kills
//!   the server. Only the temporary directory is then left behind.
//!
//! Signals are sent with the `kill` program (`/usr/bin/kill`) because the
//! crate makes no raw libc calls.
//!
//! The `redis-server` binary is looked up in `PATH`, or taken from the
//! `REDLOCK_MUX_REDIS_SERVER` environment variable when that is set. A server
//! may also be started with a binary of its own ([`RedisServer::start_program`],
//! [`RedisCluster::start_programs`]) and restarted with another on the same
//! data ([`RedisServer::restart_as`]), for quorums that mix Redis versions:
//! [`redis7_program`] and [`redis8_program`] name the two versions CI has.

use std::cell::Cell;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Environment variable that overrides the `redis-server` binary to run.
pub const REDIS_SERVER_ENV: &str = "REDLOCK_MUX_REDIS_SERVER";

/// Environment variable naming a Redis 8 `redis-server`, for tests that mix versions; when it
/// is unset, the one `.ci/install` caches (see `.ci/redis8`) is used if it is there.
pub const REDIS8_SERVER_ENV: &str = "REDLOCK_MUX_REDIS8_SERVER";

/// How long a starting server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports [`RedisServer::start_with`] tries.
const PORT_ATTEMPTS: usize = 5;
/// How many times [`RedisServer::restart`] tries to bind the old port again.
const RESTART_ATTEMPTS: usize = 3;
/// How long `Drop` and [`RedisServer::kill`] wait for a killed child.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// One `redis-server` child process on 127.0.0.1.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    pid: u32,
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    paused: Cell<bool>,
    /// The binary this server runs; `None` for the default ([`REDIS_SERVER_ENV`] or `PATH`).
    program: Option<PathBuf>,
}

impl RedisServer {
    /// Starts `program` (a `redis-server` binary) as [`start_with`](Self::start_with) does.
    pub fn start_program(program: &Path, extra_args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(Some(program.to_path_buf()), extra_args)
    }

    /// Restarts the server on the same port and directory (so that AOF/RDB data is reloaded)
    /// with another binary: an upgrade (or downgrade) in place. A running server is killed
    /// first, by its PID.
    pub fn restart_as(&mut self, program: &Path) -> io::Result<()> {
        self.program = Some(program.to_path_buf());
        self.restart()
    }

    /// Starts a server without persistence (`--save "" --appendonly no`).
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(&[])
    }

    /// Starts a server with `extra_args` appended to the defaults; later
    /// arguments override earlier ones, e.g. `["--requirepass", "pw"]` or
    /// `["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start_with(extra_args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(None, extra_args)
    }

    fn start_inner(program: Option<PathBuf>, extra_args: &[&str]) -> io::Result<RedisServer> {
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!(
                "redlock-mux-{}-{}-{}",
                std::process::id(),
                port,
                DIR_COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir)?;
            let mut server = RedisServer {
                child: None,
                watchdog: None,
                pid: 0,
                port,
                dir,
                extra_args: extra_args.clone(),
                paused: Cell::new(false),
                program: program.clone(),
            };
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                // A missing binary will not appear on the next port.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                // Most likely the port was taken in the meantime; dropping
                // `server` kills what is left and removes its directory.
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// PID of the server process; after [`kill`](Self::kill) the PID it
    /// had, after [`restart`](Self::restart) the new one.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's private directory (data files and `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is
    /// answered until [`resume`](Self::resume).
    pub fn pause(&self) -> io::Result<()> {
        let pid = self.live_pid()?;
        signal("-STOP", pid)?;
        self.paused.set(true);
        Ok(())
    }

    /// Continues a server frozen by [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        let pid = self.live_pid()?;
        signal("-CONT", pid)?;
        self.paused.set(false);
        Ok(())
    }

    /// Kills the server with SIGKILL and reaps it. Calling it again, or on a
    /// server that already exited, is a no-op. The directory is kept so that
    /// [`restart`](Self::restart) can reload persisted data.
    pub fn kill(&mut self) -> io::Result<()> {
        // Disarm the watchdog first: once the server is reaped its PID may
        // be reused, and the watchdog must not kill a stranger.
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        self.paused.set(false);
        if child.try_wait()?.is_none() {
            // SIGKILL also ends a stopped process; no SIGCONT needed.
            signal("-KILL", child.id())?;
        }
        reap(&mut child, REAP_TIMEOUT)
    }

    /// Starts the server again on the same port with the same directory and
    /// arguments (so AOF/RDB data is reloaded) and waits until it answers.
    /// A running server is killed first.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill()?;
        let mut last_err = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                thread::sleep(Duration::from_millis(100));
            }
            match self.spawn_and_wait() {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => {
                    let _ = self.kill();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server did not restart")))
    }

    /// Whether the server process is still alive (a paused server is).
    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            _ => {
                // It exited on its own and is reaped now: clean up our side.
                let _ = self.kill();
                false
            }
        }
    }

    fn live_pid(&self) -> io::Result<u32> {
        match &self.child {
            Some(child) => Ok(child.id()),
            None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("redis-server on port {} is not running", self.port),
            )),
        }
    }

    /// Spawns `redis-server` for `self.port`/`self.dir` and waits until it
    /// answers. On error the child may still be set; the caller kills it.
    fn spawn_and_wait(&mut self) -> io::Result<()> {
        let program = match &self.program {
            Some(p) => p.to_string_lossy().into_owned(),
            None => redis_server_program(),
        };
        let port = self.port.to_string();
        let logfile = self.dir.join("redis.log");
        // Fatal configuration errors only go to stderr: keep them in a file
        // (not in the test output) and report them if the start fails.
        let stderr_file = self.dir.join("redis.stderr");
        let stderr = fs::File::create(&stderr_file)?;
        let mut command = Command::new(&program);
        command
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--logfile")
            .arg(&logfile)
            .args(["--loglevel", "warning"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "cannot run {program:?}: {e}; install it with `bash .ci/install` \
                         (or `apt-get install -y redis-server`), or point {REDIS_SERVER_ENV} at it"
                    ),
                )
            } else {
                e
            }
        })?;
        let pid = child.id();
        self.pid = pid;
        self.child = Some(child);
        self.watchdog = Watchdog::arm(pid);
        self.wait_ready(pid).map_err(|e| {
            let mut message = e.to_string();
            for file in [&stderr_file, &logfile] {
                let text = fs::read_to_string(file).unwrap_or_default();
                let text = text.trim();
                if !text.is_empty() {
                    message += &format!("\n{}:\n{text}", file.display());
                }
            }
            io::Error::new(e.kind(), message)
        })
    }

    /// Polls with `PING` until our own child answers, within READY_TIMEOUT.
    fn wait_ready(&mut self, pid: u32) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let password = self.password();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().transpose()) {
                return Err(io::Error::other(format!(
                    "redis-server on port {} exited early ({})",
                    self.port, status?
                )));
            }
            if let Ok(true) = probe(self.addr(), pid, password.as_deref()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server on port {} not ready after {:?}",
                        self.port, READY_TIMEOUT
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last `--requirepass` value among the extra arguments.
    fn password(&self) -> Option<String> {
        let args = &self.extra_args;
        (0..args.len().saturating_sub(1))
            .rev()
            .find(|&i| args[i] == "--requirepass")
            .map(|i| args[i + 1].clone())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.paused.get() {
            let _ = self.resume();
        }
        let _ = self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// N independent Redis masters (not Redis Cluster), as Redlock wants them.
#[derive(Debug)]
pub struct RedisCluster {
    /// The servers, in start order.
    pub servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` servers without persistence. If one fails, those already
    /// started are stopped again.
    pub fn start(n: usize) -> io::Result<Self> {
        let servers = (0..n)
            .map(|_| RedisServer::start())
            .collect::<io::Result<Vec<_>>>()?;
        Ok(RedisCluster { servers })
    }

    /// Starts one server per entry of `programs`, each with its own binary (`None`: the
    /// default), without persistence.
    pub fn start_programs(programs: &[Option<&Path>]) -> io::Result<Self> {
        let servers = programs
            .iter()
            .map(|p| match p {
                Some(p) => RedisServer::start_program(p, &[]),
                None => RedisServer::start(),
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(RedisCluster { servers })
    }

    /// `redis://127.0.0.1:port` of every server.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// Socket address of every server.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(RedisServer::addr).collect()
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there are no servers.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

/// `sh` child that kills the server when its stdin reaches end of file,
/// which happens when we close the pipe or when this process dies in any
/// way (the kernel closes our end).
#[derive(Debug)]
struct Watchdog {
    child: Child,
    // Held open until the watchdog is disarmed.
    _stdin: ChildStdin,
}

impl Watchdog {
    /// Best effort: without `sh` the server is still stopped by `Drop`.
    fn arm(server_pid: u32) -> Option<Watchdog> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "read _ignored; kill -CONT {server_pid}; kill -KILL {server_pid}"
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let stdin = child.stdin.take()?;
        Some(Watchdog {
            child,
            _stdin: stdin,
        })
    }

    /// Stops the watchdog without letting it signal anything.
    fn disarm(mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = signal("-KILL", self.child.id());
        }
        let _ = reap(&mut self.child, REAP_TIMEOUT);
    }
}

fn redis_server_program() -> String {
    std::env::var(REDIS_SERVER_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// Debian's Redis 7.0: `redis-server` on `PATH`, whatever [`REDIS_SERVER_ENV`] says.
pub fn redis7_program() -> PathBuf {
    PathBuf::from("redis-server")
}

/// A Redis 8 `redis-server`: [`REDIS8_SERVER_ENV`], or the 8.2 binary `.ci/install` caches
/// (`$REDLOCK_MUX_CACHE`, `$XDG_CACHE_HOME/redlock-mux` or `~/.cache/redlock-mux`, then
/// `redis-8.2.3/redis-server`); `None` when there is none.
pub fn redis8_program() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = env(REDIS8_SERVER_ENV) {
        return Some(PathBuf::from(p));
    }
    let cache = env("REDLOCK_MUX_CACHE")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("redlock-mux")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/redlock-mux")))?;
    let bin = cache.join("redis-8.2.3/redis-server");
    bin.is_file().then_some(bin)
}

/// A port that was free a moment ago (bind to port 0, read it, release it).
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Sends a signal with the `kill` program.
fn signal(sig: &str, pid: u32) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "kill {sig} {pid} failed: {status}"
        )))
    }
}

/// Waits for a child that was sent SIGKILL, bounded by `timeout`.
fn reap(child: &mut Child, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("process {} did not exit", child.id()),
            ));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// One readiness check: `PING` must be answered, and the answering server
/// must be our child (`INFO server` reports its `process_id`), so that a
/// port grabbed by another server in the meantime is not mistaken for ours.
/// When the server wants a password we do not know, `-NOAUTH` is accepted.
fn probe(addr: SocketAddr, pid: u32, password: Option<&str>) -> io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.set_write_timeout(Some(Duration::from_millis(500)))?;
    let mut reader = LineReader::default();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let reply = reader.line(&mut stream)?;
    if reply.starts_with(b"-NOAUTH") {
        let Some(password) = password else {
            return Ok(true);
        };
        let mut auth = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n", password.len()).into_bytes();
        auth.extend_from_slice(password.as_bytes());
        auth.extend_from_slice(b"\r\n");
        stream.write_all(&auth)?;
        if reader.line(&mut stream)? != b"+OK" {
            return Ok(false);
        }
        // Authenticated: the server now answers -LOADING until its data is back in memory.
        stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        if reader.line(&mut stream)? != b"+PONG" {
            return Ok(false);
        }
    } else if reply != b"+PONG" {
        // e.g. -LOADING while the AOF is read back
        return Ok(false);
    }
    stream.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")?;
    let header = reader.line(&mut stream)?;
    let Some(len) = header
        .strip_prefix(b"$")
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return Ok(false);
    };
    let info = reader.exact(&mut stream, len)?;
    let wanted = format!("process_id:{pid}\r\n");
    Ok(info.windows(wanted.len()).any(|w| w == wanted.as_bytes()))
}

/// Minimal buffered reader for the readiness probe.
#[derive(Default)]
struct LineReader {
    buf: Vec<u8>,
}

impl LineReader {
    /// Next line without its CRLF.
    fn line(&mut self, stream: &mut TcpStream) -> io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..end].to_vec();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            self.fill(stream)?;
        }
    }

    /// Next `len` bytes plus the CRLF that ends a bulk string.
    fn exact(&mut self, stream: &mut TcpStream, len: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < len + 2 {
            self.fill(stream)?;
        }
        let data = self.buf[..len].to_vec();
        self.buf.drain(..len + 2);
        Ok(data)
    }

    fn fill(&mut self, stream: &mut TcpStream) -> io::Result<()> {
        if self.buf.len() > 1 << 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "reply too long"));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}
