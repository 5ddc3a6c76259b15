//! A lock's validity, computed here and nowhere else: from its TTL, the drift allowance, and
//! when the round that set it started.
//!
//! Redlock's arithmetic (the algorithm's steps 1 to 4): a lock set with TTL `ttl` by a round
//! started at `start` is valid until `start + ttl − drift`, where `drift = ttl × drift_factor +
//! 2 ms`; it counts from the round's start, not from its decision, so the time the round took is
//! subtracted too. A round must be won before that instant (and an extend before the validity
//! the lock has now); a failed extend may have reset the TTL on some nodes, so the validity
//! becomes at most `start + ttl − drift` ([`failed_extend_cap`]).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::config::MAX_TTL;
use crate::error::InvalidArgument;

/// The clock arithmetic of Redlock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The TTL the keys are set with.
    pub ttl: Duration,
    /// Relative clock drift between processes allowed for, as a fraction of the TTL.
    pub drift_factor: f64,
}

/// The fixed part of the drift allowance: Redis expires keys with 1 ms resolution, on each side.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

impl Timing {
    /// The drift allowance: `ttl * drift_factor + 2 ms`.
    pub fn drift(&self) -> Duration {
        self.ttl.mul_f64(self.drift_factor) + DRIFT_FLOOR
    }

    /// `ttl - elapsed - drift`, or `None` when that is not positive.
    pub fn validity(&self, elapsed: Duration) -> Option<Duration> {
        self.ttl
            .checked_sub(elapsed)?
            .checked_sub(self.drift())
            .filter(|v| !v.is_zero())
    }

    /// The instant the lock stops being valid, for an attempt that started at `start`:
    /// `start + ttl - drift`. `None` if the TTL does not exceed the drift allowance.
    pub fn valid_until(&self, start: Instant) -> Option<Instant> {
        start.checked_add(self.validity(Duration::ZERO)?)
    }
}

impl Timing {
    /// The timing of a lock of `ttl` for a client whose drift factor is `drift_factor`, with the
    /// TTL in whole milliseconds as the nodes are sent it. Refused: a zero TTL, one past
    /// [`MAX_TTL`], and one that the drift allowance leaves no validity.
    pub fn for_ttl(ttl: Duration, drift_factor: f64) -> Result<(u64, Timing), InvalidArgument> {
        if ttl.is_zero() {
            return Err(InvalidArgument::ZeroTtl);
        }
        if ttl > MAX_TTL || Instant::now().checked_add(ttl).is_none() {
            return Err(InvalidArgument::TtlOutOfRange { ttl });
        }
        let ttl_ms = ttl.as_millis() as u64;
        let timing = Timing {
            ttl: Duration::from_millis(ttl_ms),
            drift_factor,
        };
        if timing.validity(Duration::ZERO).is_none() {
            return Err(InvalidArgument::TtlBelowDrift {
                ttl,
                drift: timing.drift(),
            });
        }
        Ok((ttl_ms, timing))
    }
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

/// The latest a lock can still be valid after an extend with `timing`, started at `start`,
/// was lost: the nodes that applied it (or apply it late) hold the lock until `ttl` after the
/// round began, whatever it held before.
pub fn failed_extend_cap(start: Instant, timing: Timing) -> Instant {
    timing.valid_until(start).unwrap_or(start)
}
