//! The cleanups of lost attempts that a member asked to wait for replicas (`?wait=N`,
//! `?waitaof=L,R`) has run, but that no `WAIT` has yet said its replicas have; and the
//! releases whose own `WAIT` fell short.
//!
//! A cleanup's first try goes without a `WAIT` of its own: every lost attempt sends one to
//! every node, and a `WAIT` behind each would hold up the connection that every caller
//! shares. But a cleanup that only the master acknowledged is lost with the master in a
//! failover, and the attempt's key is left on the replica promoted in its place until it
//! expires. So it is kept, with its bytes, until a `WAIT` (and `WAITAOF`) sent after it on the
//! same connection says enough replicas (and fsyncs) have it: `WAIT` acknowledges every
//! earlier write of its connection, so the next grant's, extend's or release's does, or one
//! the endpoint sends itself once the connection is idle. One still kept when its connection
//! breaks goes again on the node's next connection (to the master promoted in a failover), as
//! a release does, those owed together behind one `WAIT`: it is a compare-and-delete of the
//! attempt's own token, which never deletes another holder's key.
//!
//! A release whose own `WAIT` fell short (its owner heard the failure) is kept the same way:
//! the master ran it, so it is not sent again on that connection, but a later `WAIT` there
//! (a grant's, or the endpoint's own once the connection is idle, after a backoff that grows
//! while they fall short) confirms it once the replicas have it. Each is kept until what it
//! deletes has expired at the latest; one still kept when its connection breaks goes again on
//! the next one.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::conn::{Conn, Redo, BACKOFF_MAX, BACKOFF_MIN};

/// The cleanups a node's command connection ran and no `WAIT` confirmed yet (see the module
/// docs).
#[derive(Debug)]
pub(super) struct Unconfirmed {
    /// Each cleanup (its bytes, the next `len` of `bytes`), oldest first.
    redos: Vec<Redo>,
    bytes: Vec<u8>,
    /// The waits being read (`WAIT`, then `WAITAOF`) have all said enough so far.
    enough: bool,
    /// Not before when the endpoint sends a `WAIT` of its own for them (after one fell
    /// short), and the wait before the next one.
    at: Option<Instant>,
    backoff: Duration,
}

impl Default for Unconfirmed {
    fn default() -> Unconfirmed {
        Unconfirmed {
            redos: Vec::new(),
            bytes: Vec::new(),
            enough: true,
            at: None,
            backoff: BACKOFF_MIN,
        }
    }
}

impl Unconfirmed {
    /// The cleanup `command` (`redo`) was answered, without a `WAIT` behind it.
    pub fn push(&mut self, redo: Redo, command: &[u8]) {
        self.bytes.extend_from_slice(command);
        self.redos.push(Redo {
            len: command.len() as u32,
            ..redo
        });
    }

    /// The compare-and-delete `command` (`redo`) ran, but the `WAIT` (or `WAITAOF`) behind it
    /// fell short at `now`: a later one on the same connection may still confirm it, after
    /// the backoff of one that fell short.
    pub fn push_short(&mut self, redo: Redo, command: &[u8], now: Instant) {
        self.push(redo, command);
        if self.at.is_none() {
            self.at = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Whether one is kept that is still worth it at `now`.
    pub fn owes_until(&self, now: Instant) -> bool {
        self.redos.iter().any(|r| r.until > now)
    }

    /// A wait's reply was read: `first` of its sequence (a `WAIT`, or a `WAITAOF` without
    /// one), saying `enough`, with `more` waits of the sequence after it. Once the sequence
    /// said enough, every cleanup kept was written before it: each is confirmed. One that fell
    /// short leaves them kept, and the endpoint's own `WAIT` for them waits a backoff.
    pub fn waited(&mut self, first: bool, enough: bool, more: bool, now: Instant) {
        self.enough = enough && (first || self.enough);
        if more {
            return;
        }
        if std::mem::replace(&mut self.enough, true) {
            self.clear();
        } else if !self.redos.is_empty() {
            self.at = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// When the endpoint sends a `WAIT` of its own for the cleanups kept, on `cmd`, the
    /// connection they ran on: once it is idle (nothing owed: a `WAIT` queued behind other
    /// commands would confirm them, or hold up a grant's), after the backoff of one that fell
    /// short.
    pub fn due(&self, cmd: &Conn) -> Option<Instant> {
        if self.redos.is_empty() || !cmd.is_ready() || cmd.owed() > 0 {
            return None;
        }
        self.at
    }

    /// Whether the endpoint sends a `WAIT` of its own on `cmd` at `now` (see
    /// [`due`](Self::due)), forgetting those no longer worth it.
    pub fn wants_wait(&mut self, cmd: &Conn, now: Instant) -> bool {
        if self.redos.iter().all(|r| r.until <= now) {
            self.clear();
            return false;
        }
        if !cmd.is_ready() || cmd.owed() > 0 || self.at.is_some_and(|t| t > now) {
            return false;
        }
        self.at = None;
        true
    }

    /// The connection broke: every one still worth it at `now`, to send again on the next.
    pub fn drain(&mut self, now: Instant, mut each: impl FnMut(Redo, &[u8])) {
        let mut at = 0;
        for r in &self.redos {
            let end = at + r.len as usize;
            if r.until > now {
                each(*r, &self.bytes[at..end]);
            }
            at = end;
        }
        self.clear();
    }

    fn clear(&mut self) {
        self.redos.clear();
        self.bytes.clear();
        self.at = None;
        self.backoff = BACKOFF_MIN;
    }
}
