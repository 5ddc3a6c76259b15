//! A `rediss://` connection's TLS session: rustls's client connection, with what a connection
//! needs of it (its handshake, writing and reading plaintext, what a failure means).
//!
//! It makes no system call of its own: rustls is sans-IO, and so is this. The driver hands
//! each call the connection's stream (anything that reads and writes bytes, non-blocking), and
//! the session moves ciphertext through it: a `WouldBlock` from the stream ends the call, and
//! what the stream did not take yet stays with the session, to go first next time.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};

use rustls::ClientConnection;

use crate::error::NodeErrorKind;

/// A TLS session over a connection's stream, while and after its handshake.
#[derive(Debug)]
pub(crate) struct Session {
    session: ClientConnection,
    /// The handshake is not over yet.
    handshaking: bool,
}

impl Session {
    /// The session `session` (from `TlsContext::connect`), its handshake not started.
    pub fn new(session: ClientConnection) -> Session {
        Session {
            session,
            handshaking: true,
        }
    }

    /// Whether the session has bytes of its own to write (a handshake message, an alert, a
    /// key update): the stream must be watched for room to write.
    pub fn wants_write(&self) -> bool {
        self.session.wants_write()
    }

    /// Moves the handshake on as far as `stream` allows: `Ok(true)` once it is over.
    pub fn handshake(&mut self, stream: &mut (impl Read + Write)) -> Result<bool, NodeErrorKind> {
        loop {
            flush(&mut self.session, stream)?;
            if !self.session.is_handshaking() {
                self.handshaking = false;
                return Ok(true);
            }
            match self.session.read_tls(stream) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof)),
                Ok(_) => {
                    if let Err(e) = self.session.process_new_packets() {
                        // The alert that says why goes out, if it can.
                        let _ = flush(&mut self.session, stream);
                        return Err(super::failure(e, true));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
    }

    /// Encrypts as much of `bytes` as the session takes, and writes what `stream` takes of it;
    /// returns how much of `bytes` was taken.
    pub fn write(
        &mut self,
        stream: &mut (impl Read + Write),
        bytes: &[u8],
    ) -> Result<usize, NodeErrorKind> {
        flush(&mut self.session, stream)?;
        let n = self
            .session
            .writer()
            .write(bytes)
            .map_err(|e| NodeErrorKind::Io(e.kind()))?;
        flush(&mut self.session, stream)?;
        Ok(n)
    }

    /// Reads into `buf` what the session has decrypted, then more from `stream`, until the
    /// stream has nothing more: `Ok(Some((n, false)))` for `n` bytes (never reported as
    /// drained: a record may hold more than `buf` takes), `Ok(None)` when nothing is there.
    /// The peer's end of the session or of the stream is an error.
    pub fn read(
        &mut self,
        stream: &mut (impl Read + Write),
        buf: &mut [u8],
    ) -> Result<Option<(usize, bool)>, NodeErrorKind> {
        loop {
            match self.session.reader().read(buf) {
                // The peer closed the session (close_notify).
                Ok(0) if !buf.is_empty() => {
                    return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof))
                }
                Ok(n) => return Ok(Some((n, false))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
            match self.session.read_tls(stream) {
                Ok(0) => return Err(NodeErrorKind::Io(io::ErrorKind::UnexpectedEof)),
                Ok(_) => {
                    if let Err(e) = self.session.process_new_packets() {
                        let _ = flush(&mut self.session, stream);
                        return Err(super::failure(e, self.handshaking));
                    }
                    // What the session has to say in return (a key update) goes out now.
                    flush(&mut self.session, stream)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeErrorKind::Io(e.kind())),
            }
        }
    }

    /// What a TLS server that closed a connection right after its handshake, before
    /// answering anything, has against this client: a TLS 1.3 server judges the client's
    /// certificate once the client has finished its part, and its alert is lost when it closes
    /// the connection with our first commands unread (the kernel resets it). This makes the
    /// handshake over `stream` (blocking, with timeouts of its own: a probe's) and sends
    /// nothing after it, so that the server's verdict can be read: an alert, or nothing while
    /// `going` says so.
    pub fn refusal(
        mut self,
        stream: &mut (impl Read + Write),
        mut going: impl FnMut() -> bool,
    ) -> Option<NodeErrorKind> {
        let session = &mut self.session;
        let mut byte = [0u8; 1];
        while going() {
            if session.wants_write() {
                session.write_tls(stream).ok()?;
                continue;
            }
            if !session.is_handshaking() {
                match session.reader().read(&mut byte) {
                    Ok(_) => return None,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return None,
                }
            }
            match session.read_tls(stream) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {
                    if let Err(e) = session.process_new_packets() {
                        return Some(super::failure(e, true));
                    }
                }
            }
        }
        None
    }
}

/// Writes what the TLS session has to send, until it has nothing or the stream takes no more.
fn flush(
    session: &mut ClientConnection,
    stream: &mut (impl Read + Write),
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
