//! Closing: the client stops taking operations and waits, for a bounded time, for its nodes
//! to answer what they were sent (the compare-and-deletes owed most of all).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::Endpoint;

/// How long closing waits at most for the nodes to answer what they were sent, and how long
/// without any answer before it gives up on those that still owe.
pub(crate) const CLOSE_LIMIT: Duration = Duration::from_secs(10);
pub(crate) const CLOSE_STALL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
pub(super) struct Closing {
    pub until: Instant,
    pub progress: Instant,
}

impl Endpoint {
    /// The client closes from `now` on: [`close_outcome`](Self::close_outcome) says when
    /// that is over. Until then the shell keeps writing, reading and running the timers:
    /// nodes answer what they owe, and the compare-and-deletes of broken connections are sent
    /// again. It is over once nothing is owed, after [`CLOSE_LIMIT`], or once no node has
    /// answered anything for [`CLOSE_STALL`] (those that owe are down, or paused; a cluster's
    /// answers to topology reads are no progress on what is owed). A close that follows another
    /// with no operation in between (a drop after `close()`) ends by the first one's limit:
    /// the two together wait [`CLOSE_LIMIT`] at most.
    pub fn begin_close(&mut self, now: Instant) {
        let until = *self.closed_until.get_or_insert(now + CLOSE_LIMIT);
        self.closing = Some(Closing {
            until,
            progress: now,
        });
        self.handle_timeout(now);
    }

    /// Once closing is over: the nodes left with compare-and-deletes (releases, cleanups) not
    /// known to have reached them, which keep what they were to delete until its TTL. `None`
    /// while it goes on, or when the client is not closing.
    pub fn close_outcome(&mut self, now: Instant) -> Option<Vec<usize>> {
        let c = self.closing?;
        let over = !self.busy(now)
            || now >= c.until
            || now.saturating_duration_since(c.progress) >= CLOSE_STALL;
        if !over {
            return None;
        }
        self.closing = None;
        Some(self.undelivered(now))
    }
}
