//! One connection's socket: the non-blocking connect (TCP, or a Unix domain socket), the TLS
//! handshake of a `rediss://` node, reads and writes until `WouldBlock`, and the poll
//! registration that follows what the connection has to write.
//!
//! Everything about the connect procedure lives here and nowhere else: a non-blocking
//! `connect` finishes only after a WRITABLE event, a clean `take_error()` and a `peer_addr()`
//! that answers; anything earlier is a spurious wake-up. On a TLS connection the connect then
//! goes on until the handshake is over: nothing of the connection's own (its setup, with the
//! password) is written before the server's certificate and name have been verified.
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

/// A TLS session over the stream, while and after its handshake.
#[cfg(feature = "tls")]
#[derive(Debug)]
struct Tls {
    session: rustls::ClientConnection,
    /// The handshake is not over yet.
    handshaking: bool,
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
    tls: Option<Box<Tls>>,
}

/// `connect` on a non-blocking socket reports this while the handshake is under way (std has no
/// stable `ErrorKind` for it yet).
#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

/// A TLS session to start once the stream is connected, under the `tls` feature.
#[cfg(feature = "tls")]
pub(crate) type Session = rustls::ClientConnection;
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
            tls: tls.map(|session| {
                Box::new(Tls {
                    session,
                    handshaking: true,
                })
            }),
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
        let Some(tls) = self.tls.as_deref_mut() else {
            return Ok(true);
        };
        loop {
            flush_tls(&mut tls.session, &mut self.stream)?;
            if !tls.session.is_handshaking() {
                tls.handshaking = false;
                return Ok(true);
            }
            match tls.session.read_tls(&mut self.stream) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof)),
                Ok(_) => {
                    if let Err(e) = tls.session.process_new_packets() {
                        // The alert that says why goes out, if it can.
                        let _ = flush_tls(&mut tls.session, &mut self.stream);
                        return Err(crate::tls::failure(e, true));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
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
            flush_tls(&mut tls.session, &mut self.stream)?;
            let n = tls
                .session
                .writer()
                .write(bytes)
                .map_err(|e| NodeErrorKind::Io(e.kind()))?;
            flush_tls(&mut tls.session, &mut self.stream)?;
            return Ok(n);
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
        if self.tls.is_some() {
            return self.read_tls(buf);
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

    /// [`read`](Self::read) on a TLS connection: what the session has decrypted, then more
    /// from the socket, until the socket has nothing more (it never reports a short read as
    /// drained: a record may hold more than `buf` takes).
    #[cfg(feature = "tls")]
    fn read_tls(&mut self, buf: &mut [u8]) -> Result<Option<(usize, bool)>, NodeErrorKind> {
        let Some(tls) = self.tls.as_deref_mut() else {
            return Ok(None);
        };
        loop {
            match tls.session.reader().read(buf) {
                // The peer closed the session (close_notify).
                Ok(0) if !buf.is_empty() => {
                    return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof))
                }
                Ok(n) => return Ok(Some((n, false))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
            match tls.session.read_tls(&mut self.stream) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof)),
                Ok(_) => {
                    if let Err(e) = tls.session.process_new_packets() {
                        let _ = flush_tls(&mut tls.session, &mut self.stream);
                        return Err(crate::tls::failure(e, tls.handshaking));
                    }
                    // What the session has to say in return (a key update) goes out now.
                    flush_tls(&mut tls.session, &mut self.stream)?;
                }
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
        let output = output
            || self
                .tls
                .as_ref()
                .is_some_and(|tls| tls.session.wants_write());
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

/// Writes what the TLS session has to send, until it has nothing or the socket takes no more.
#[cfg(feature = "tls")]
fn flush_tls(
    session: &mut rustls::ClientConnection,
    stream: &mut Stream,
) -> Result<(), NodeErrorKind> {
    while session.wants_write() {
        match session.write_tls(stream) {
            Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::WriteZero)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(NodeErrorKind::Io(e.kind())),
        }
    }
    Ok(())
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
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let ok = stream.set_read_timeout(Some(timeout)).is_ok()
        && stream.set_write_timeout(Some(timeout)).is_ok()
        && stream.write_all(&client_hello()).is_ok();
    let mut head = [0u8; 2];
    // A handshake record (0x16) or an alert (0x15), of TLS (major version 3).
    ok && stream.read_exact(&mut head).is_ok() && matches!(head, [0x15 | 0x16, 0x03])
}

/// A TLS 1.2 ClientHello that any TLS server answers, with a ServerHello or an alert: ECDHE
/// suites with AES-GCM, the common groups and signature schemes. Only the first bytes of the
/// answer are read.
fn client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x03]; // TLS 1.2
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // no session id
    let suites: [u16; 5] = [0xc02b, 0xc02f, 0xc02c, 0xc030, 0x1301];
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // groups: x25519, P-256
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // point formats: uncompressed
        0x00, 0x0d, 0x00, 0x0a, 0x00, 0x08, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x05,
        0x01, // signature schemes
    ];
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(extensions);
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// What a TLS server that closed a connection right after its handshake, before answering
/// anything, has against this client: a TLS 1.3 server judges the client's certificate once
/// the client has finished its part, and its alert is lost when it closes the connection with
/// our first commands unread (the kernel resets it). This probe makes a handshake with
/// `session` and sends nothing after it, so the server's verdict (an alert, or nothing until
/// `timeout`) can be read. A blocking probe, made only then.
#[cfg(feature = "tls")]
pub(crate) fn tls_refusal(
    addr: SocketAddr,
    mut session: rustls::ClientConnection,
    timeout: Duration,
) -> Option<NodeErrorKind> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let deadline = std::time::Instant::now() + timeout;
    let mut byte = [0u8; 1];
    while std::time::Instant::now() < deadline {
        if session.wants_write() {
            session.write_tls(&mut stream).ok()?;
            continue;
        }
        if !session.is_handshaking() {
            match session.reader().read(&mut byte) {
                Ok(_) => return None,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
        }
        match session.read_tls(&mut stream) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {
                if let Err(e) = session.process_new_packets() {
                    return Some(crate::tls::failure(e, true));
                }
            }
        }
    }
    None
}
