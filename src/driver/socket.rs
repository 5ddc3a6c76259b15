//! One connection's socket: the non-blocking connect (TCP, or a Unix domain socket), the TLS
//! handshake of a `rediss://` node, reads and writes until `WouldBlock`, and the poll
//! registration that follows what the connection has to write.
//!
//! Everything about the connect procedure lives here and nowhere else: a non-blocking
//! `connect` finishes only after a WRITABLE event, a clean `take_error()` and a `peer_addr()`
//! that answers; anything earlier is a spurious wake-up. On a TLS connection the connect then
//! goes on until the handshake is over: nothing of the connection's own (its setup, with the
//! password) is written before the server's certificate and name have been verified. The TLS
//! session itself ([`crate::tls::session`]) encrypts and decrypts: the socket moves its
//! ciphertext.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::SocketAddr;
#[cfg(unix)]
use std::path::Path;
use std::time::Duration;

use mio::event::Source;
use mio::net::TcpStream;
#[cfg(unix)]
use mio::net::UnixStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket as RawSocket, TcpKeepalive, Type};

use crate::error::NodeErrorKind;
use crate::tls::hello;
use crate::url::Target;

/// Keepalive probes sent to an idle peer before the kernel gives the connection up.
const KEEPALIVE_PROBES: u32 = 2;

/// A connected (or connecting) stream: TCP, or a Unix domain socket.
#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    fn take_error(&self) -> io::Result<Option<io::Error>> {
        match self {
            Stream::Tcp(s) => s.take_error(),
            #[cfg(unix)]
            Stream::Unix(s) => s.take_error(),
        }
    }

    /// Whether the connect has finished: the peer's address answers.
    fn peer_known(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(drop),
            #[cfg(unix)]
            Stream::Unix(s) => s.peer_addr().map(drop),
        }
    }

    fn source(&mut self) -> &mut dyn Source {
        match self {
            Stream::Tcp(s) => s,
            #[cfg(unix)]
            Stream::Unix(s) => s,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection's socket.
#[derive(Debug)]
pub(crate) struct Socket {
    stream: Stream,
    token: Token,
    registered: Option<Interest>,
    /// The connect (and, on a TLS connection, its handshake) is under way.
    connecting: bool,
    /// The stream's own connect has finished (a TLS handshake may still be under way).
    linked: bool,
    /// The poller reported a hang-up or error: read until the socket says so.
    hangup: bool,
    #[cfg(feature = "tls")]
    tls: Option<Box<Session>>,
}

/// `connect` on a non-blocking socket reports this while the handshake is under way (std has no
/// stable `ErrorKind` for it yet).
#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

/// A TLS session to start once the stream is connected, under the `tls` feature.
#[cfg(feature = "tls")]
pub(crate) use crate::tls::session::Session;
/// Without the `tls` feature there is no session to give.
#[cfg(not(feature = "tls"))]
pub(crate) type Session = std::convert::Infallible;

fn in_progress(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(EINPROGRESS)
}

impl Socket {
    /// A non-blocking socket to `target`, connect started, registered with `registry` under
    /// `token`; with `tls`, the connect goes on with that session's handshake.
    ///
    /// A TCP socket has TCP_NODELAY (each command is one small write that must not wait for
    /// Nagle), and a peer silent for `dead_after` is given up by the kernel: written data
    /// unacknowledged that long (TCP_USER_TIMEOUT), or, while idle, keepalive probes every
    /// third of it, after a third of it without traffic, unanswered. A slow or paused server
    /// still acknowledges, so it is never given up for slowness. A Unix socket's peer is on
    /// this machine: the kernel tells at once when it is gone.
    pub fn connect(
        target: Target<'_>,
        tls: Option<Session>,
        dead_after: Duration,
        registry: &Registry,
        token: Token,
    ) -> io::Result<Socket> {
        let stream = match target {
            Target::Tcp(addr) => Stream::Tcp(connect_tcp(addr, dead_after)?),
            #[cfg(unix)]
            Target::Unix(path) => Stream::Unix(connect_unix(path)?),
            #[cfg(not(unix))]
            Target::Unix(_) => return Err(io::ErrorKind::Unsupported.into()),
        };
        #[cfg(not(feature = "tls"))]
        let _ = tls;
        let mut s = Socket {
            stream,
            token,
            registered: None,
            connecting: true,
            linked: false,
            hangup: false,
            #[cfg(feature = "tls")]
            tls: tls.map(Box::new),
        };
        s.update_interest(registry, false)?;
        Ok(s)
    }

    /// Whether the connect (with its TLS handshake) is still under way.
    pub fn is_connecting(&self) -> bool {
        self.connecting
    }

    /// Whether the stream is connected and its TLS handshake under way.
    pub fn is_handshaking(&self) -> bool {
        self.connecting && self.linked
    }

    /// Checks a connect in progress after a readiness event: `Ok(true)` once it has finished
    /// (with the TLS handshake of a TLS connection), `Ok(false)` while it goes on.
    pub fn finish_connect(&mut self) -> Result<bool, NodeErrorKind> {
        if !self.connecting {
            return Ok(true);
        }
        if !self.linked {
            if let Some(e) = self
                .stream
                .take_error()
                .map_err(|e| NodeErrorKind::Connect(e.kind()))?
            {
                return Err(NodeErrorKind::Connect(e.kind()));
            }
            match self.stream.peer_known() {
                Ok(()) => self.linked = true,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(false),
                Err(e) => return Err(NodeErrorKind::Connect(e.kind())),
            }
        }
        #[cfg(feature = "tls")]
        if !self.handshake()? {
            return Ok(false);
        }
        self.connecting = false;
        Ok(true)
    }

    /// Moves the TLS handshake on as far as the socket allows: `Ok(true)` once it is over (or
    /// for a plaintext connection).
    #[cfg(feature = "tls")]
    fn handshake(&mut self) -> Result<bool, NodeErrorKind> {
        match self.tls.as_deref_mut() {
            Some(tls) => tls.handshake(&mut self.stream),
            None => Ok(true),
        }
    }

    /// Notes that the poller saw the peer hang up (or an error): the next read goes on until
    /// the socket reports it.
    pub fn hung_up(&mut self) {
        self.hangup = true;
    }

    /// Writes as much of `bytes` as the socket takes; returns how much. On a TLS connection,
    /// what the socket did not take yet is kept by the session, and written first next time.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, NodeErrorKind> {
        #[cfg(feature = "tls")]
        if let Some(tls) = self.tls.as_deref_mut() {
            return tls.write(&mut self.stream, bytes);
        }
        let mut done = 0;
        while done < bytes.len() {
            match self.stream.write(&bytes[done..]) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
        Ok(done)
    }

    /// Reads into `buf`: `Ok(Some(n))` for `n` bytes, of which a short count means the socket
    /// is drained (anything arriving later is a new edge for the poller); `Ok(None)` when
    /// nothing is there. The peer's end of stream is an error.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<Option<(usize, bool)>, NodeErrorKind> {
        #[cfg(feature = "tls")]
        if let Some(tls) = self.tls.as_deref_mut() {
            return tls.read(&mut self.stream, buf);
        }
        loop {
            match self.stream.read(buf) {
                Ok(0) if !buf.is_empty() => {
                    return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof))
                }
                // A short read emptied the receive queue, unless the peer hung up: then read on
                // until the socket reports it, or the hang-up is never seen.
                Ok(n) => return Ok(Some((n, n < buf.len() && !self.hangup))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
    }

    /// Registers for WRITABLE only while a connect is in progress or output is pending: the
    /// connection's (`output`), or the TLS session's own.
    pub fn update_interest(&mut self, registry: &Registry, output: bool) -> io::Result<()> {
        #[cfg(feature = "tls")]
        let output = output || self.tls.as_ref().is_some_and(|tls| tls.wants_write());
        let want = if self.connecting || output {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match self.registered {
            Some(have) if have == want => Ok(()),
            Some(_) => {
                registry.reregister(self.stream.source(), self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
            None => {
                registry.register(self.stream.source(), self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
        }
    }

    /// Deregisters and closes the socket.
    pub fn close(mut self, registry: &Registry) {
        let _ = registry.deregister(self.stream.source());
    }
}

fn connect_tcp(addr: SocketAddr, dead_after: Duration) -> io::Result<TcpStream> {
    let socket = RawSocket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    let third = (dead_after / 3).max(Duration::from_secs(1));
    let keepalive = TcpKeepalive::new().with_time(third).with_interval(third);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let keepalive = keepalive.with_retries(KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket.set_tcp_user_timeout(Some(dead_after))?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if in_progress(&e) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// The first address of `host` (a name a sentinel gave for its master) at `port`, if it
/// resolves: a blocking lookup.
pub(crate) fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port).to_socket_addrs().ok()?.next()
}

#[cfg(unix)]
fn connect_unix(path: &Path) -> io::Result<UnixStream> {
    UnixStream::connect(path)
}

/// Whether the server at `addr` answers a TLS hello as a TLS server does (with a handshake
/// record or an alert), within `timeout`. Asked of a plaintext connection that the server
/// closed before answering anything: a TLS port does that at the first plaintext bytes. A
/// blocking probe, made only then: a plaintext server is silent to it, a TLS one answers at
/// once.
pub(crate) fn answers_tls(addr: SocketAddr, timeout: Duration) -> bool {
    let Ok(mut stream) = probe_stream(addr, timeout) else {
        return false;
    };
    let mut head = [0u8; 2];
    stream.write_all(&hello::client_hello()).is_ok()
        && stream.read_exact(&mut head).is_ok()
        && hello::answers_like_tls(head)
}

/// What a TLS server that closed a connection right after its handshake has against this
/// client (see [`Session::refusal`]), asked with `session` over a new connection to `addr`,
/// `timeout` at most. A blocking probe, made only then.
#[cfg(feature = "tls")]
pub(crate) fn tls_refusal(
    addr: SocketAddr,
    session: Session,
    timeout: Duration,
) -> Option<NodeErrorKind> {
    let mut stream = probe_stream(addr, timeout).ok()?;
    let deadline = std::time::Instant::now() + timeout;
    session.refusal(&mut stream, || std::time::Instant::now() < deadline)
}

/// A blocking connection to `addr` for a probe, whose connect, reads and writes each take
/// `timeout` at most.
fn probe_stream(addr: SocketAddr, timeout: Duration) -> io::Result<std::net::TcpStream> {
    let stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}
