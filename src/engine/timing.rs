//! The clock arithmetic of Redlock: validity from a TTL, the time a round took and the drift
//! allowance.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// The clock arithmetic of Redlock (seed 004, steps 1 to 4).
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
