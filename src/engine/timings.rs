//! Every deadline the engine keeps, computed in one place.
//!
//! A lock operation waits on several clocks at once: each node's reply (the per-node timeout),
//! the validity a round must be won within, the wait timeout of a waiting acquisition, and so
//! on. This module computes each of them from the settings and the instants the caller passes
//! in; the state machines arm the ones that apply and ask it which comes first.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::engine::timing::Timing;

/// When a node that has not answered a round started at `start` counts as failed.
pub fn node_deadline(start: Instant, node_timeout: Duration) -> Instant {
    start.checked_add(node_timeout).unwrap_or(start)
}

/// The validity a round started at `start` gives (`None` for a round without a TTL, such as
/// a release), and the instant it must be won strictly before: that validity, and for an
/// extend also `hold_until`, the validity the lock has now. A TTL within the drift allowance
/// gives no validity at all: such a round is lost at once.
pub fn round_validity(
    start: Instant,
    timing: Option<Timing>,
    hold_until: Option<Instant>,
) -> (Option<Instant>, Option<Instant>) {
    match timing {
        None => (None, hold_until),
        Some(t) => {
            let until = t.valid_until(start).unwrap_or(start);
            (
                Some(until),
                Some(hold_until.map_or(until, |h| h.min(until))),
            )
        }
    }
}

/// The end of a waiting acquisition whose first attempt started at `first`: no attempt starts
/// at or after it.
pub fn wait_deadline(first: Instant, wait_timeout: Duration) -> Instant {
    first.checked_add(wait_timeout).unwrap_or(first)
}

/// The earlier of an optional deadline and a deadline.
pub fn earliest(a: Option<Instant>, b: Instant) -> Instant {
    a.map_or(b, |a| a.min(b))
}
