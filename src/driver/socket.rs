//! One connection's socket: the non-blocking connect, reads and writes until `WouldBlock`, and
//! the poll registration that follows what the connection has to write.
//!
//! Everything about the connect procedure lives here and nowhere else: a non-blocking
//! `connect` finishes only after a WRITABLE event, a clean `take_error()` and a `peer_addr()`
//! that answers; anything earlier is a spurious wake-up.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket as RawSocket, TcpKeepalive, Type};

use crate::error::NodeErrorKind;

/// Keepalive probes sent to an idle peer before the kernel gives the connection up.
const KEEPALIVE_PROBES: u32 = 2;

/// A connection's socket.
#[derive(Debug)]
pub(crate) struct Socket {
    stream: TcpStream,
    token: Token,
    registered: Option<Interest>,
    connecting: bool,
    /// The poller reported a hang-up or error: read until the socket says so.
    hangup: bool,
}

/// `connect` on a non-blocking socket reports this while the handshake is under way (std has no
/// stable `ErrorKind` for it yet).
#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

impl Socket {
    /// A non-blocking TCP socket to `addr`, connect started, with TCP_NODELAY (each command is
    /// one small write that must not wait for Nagle), registered with `registry` under
    /// `token`. A peer silent for `dead_after` is given up by the kernel: written data
    /// unacknowledged that long (TCP_USER_TIMEOUT), or, while idle, keepalive probes every
    /// third of it, after a third of it without traffic, unanswered. A slow or paused server
    /// still acknowledges, so it is never given up for slowness.
    pub fn connect(
        addr: SocketAddr,
        dead_after: Duration,
        registry: &Registry,
        token: Token,
    ) -> io::Result<Socket> {
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
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.raw_os_error() == Some(EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let mut s = Socket {
            stream: TcpStream::from_std(socket.into()),
            token,
            registered: None,
            connecting: true,
            hangup: false,
        };
        s.update_interest(registry, false)?;
        Ok(s)
    }

    /// Whether the connect is still under way.
    pub fn is_connecting(&self) -> bool {
        self.connecting
    }

    /// Checks a connect in progress after a readiness event: `Ok(true)` once it has finished,
    /// `Ok(false)` while it goes on (a spurious wake-up).
    pub fn finish_connect(&mut self) -> Result<bool, NodeErrorKind> {
        if !self.connecting {
            return Ok(true);
        }
        if let Some(e) = self
            .stream
            .take_error()
            .map_err(|e| NodeErrorKind::Connect(e.kind()))?
        {
            return Err(NodeErrorKind::Connect(e.kind()));
        }
        match self.stream.peer_addr() {
            Ok(_) => {
                self.connecting = false;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(NodeErrorKind::Connect(e.kind())),
        }
    }

    /// Notes that the poller saw the peer hang up (or an error): the next read goes on until
    /// the socket reports it.
    pub fn hung_up(&mut self) {
        self.hangup = true;
    }

    /// Writes as much of `bytes` as the socket takes; returns how much.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, NodeErrorKind> {
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

    /// Registers for WRITABLE only while a connect is in progress or `output` is pending.
    pub fn update_interest(&mut self, registry: &Registry, output: bool) -> io::Result<()> {
        let want = if self.connecting || output {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match self.registered {
            Some(have) if have == want => Ok(()),
            Some(_) => {
                registry.reregister(&mut self.stream, self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
            None => {
                registry.register(&mut self.stream, self.token, want)?;
                self.registered = Some(want);
                Ok(())
            }
        }
    }

    /// Deregisters and closes the socket.
    pub fn close(mut self, registry: &Registry) {
        let _ = registry.deregister(&mut self.stream);
    }
}
