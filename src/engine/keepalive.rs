//! The keep-alive schedule of a kept lock, and the decision that it is lost.
//!
//! Pure: the keeper thread asks a [`Schedule`] when the next extension is due and what an
//! extension round's result means, and does the rounds and the waiting itself.
//!
//! Each extension resets the lock to the TTL, which gives it a validity of the TTL less the
//! drift allowance. The next one is due one interval later, or earlier if the validity left
//! would by then fall below a margin (see [`timings::keep_alive_margin`]); so a lock taken with
//! a shorter TTL than the one it is kept with is extended at once, and a failed extension
//! still leaves time for retries. An interval that cannot keep the lock (zero, or not shorter
//! than the validity an extension gives) is refused up front.
//!
//! A [`KeptValidity`] is the kept lock's end of validity as its keeper and its holder share
//! it: what the holder reads at any instant, and what the keeper lowers before each round and
//! sets after it. The client's keeper thread and the simulation both keep their locks with it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::engine::timings;
use crate::engine::validity::Timing;
use crate::error::{Error, InvalidArgument};

/// Keep-alive settings checked against the client: what the keeper works with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// The TTL each extension sets, in whole milliseconds, and the drift allowance.
    timing: Timing,
    /// Less than the validity an extension gives, and more than zero.
    interval: Duration,
    retry: Duration,
    /// The validity left below which an extension is due.
    margin: Duration,
}

/// The shortest retry delay: a node that fails at once must not make the keeper spin.
const MIN_RETRY: Duration = Duration::from_millis(1);

impl Schedule {
    /// Extensions to `timing`'s TTL every `interval` (a third of the TTL if `None`), failed
    /// ones retried every `retry`, for a client whose per-node timeout is `node_timeout`.
    /// Refused when the TTL gives no validity, or the interval is zero or not shorter than the
    /// validity an extension gives.
    pub fn new(
        timing: Timing,
        interval: Option<Duration>,
        retry: Duration,
        node_timeout: Duration,
    ) -> Result<Schedule, InvalidArgument> {
        let validity = timing
            .validity(Duration::ZERO)
            .ok_or(InvalidArgument::TtlBelowDrift {
                ttl: timing.ttl,
                drift: timing.drift(),
            })?;
        let interval = interval.unwrap_or(timing.ttl / 3);
        if interval.is_zero() || interval >= validity {
            return Err(InvalidArgument::KeepAliveInterval { interval, validity });
        }
        let retry = retry.clamp(MIN_RETRY, crate::config::MAX_TTL);
        Ok(Schedule {
            timing,
            interval,
            retry,
            margin: timings::keep_alive_margin(node_timeout, retry, validity),
        })
    }

    /// The TTL each extension sets.
    pub fn ttl(&self) -> Duration {
        self.timing.ttl
    }

    /// When the next extension is due, for a lock with `left` of validity at `now`.
    pub fn next_due(&self, now: Instant, left: Duration) -> Instant {
        timings::keep_alive_due(now, self.interval, left, self.margin)
    }

    /// The most the lock may be valid for once an extension round is sent at `now`, whatever
    /// comes of it: the nodes may take the new TTL from then on (a round starts at or after
    /// `now`, so this bound is on the safe side).
    pub fn cap_from(&self, now: Instant) -> Option<Instant> {
        self.timing.valid_until(now)
    }

    /// What an extension round that came to `result` means, with `left` of validity at `now`
    /// (`None` once it has run out): when to extend next, or why the lock is lost. A failure
    /// that may pass (nodes unreachable) is retried while the validity lasts; a refusal by the
    /// quorum, or the validity running out, is a loss.
    pub fn after_round(
        &self,
        result: Result<(), Error>,
        now: Instant,
        left: Option<Duration>,
    ) -> Result<Instant, Error> {
        let expired = || Error::ValidityExpired {
            elapsed: Duration::ZERO,
        };
        match (result, left) {
            (Ok(()), Some(left)) => Ok(self.next_due(now, left)),
            (Err(Error::QuorumUnreachable { .. } | Error::Io(_)), Some(left)) => {
                Ok(timings::keep_alive_retry(now, self.retry, left))
            }
            (Ok(()) | Err(Error::QuorumUnreachable { .. } | Error::Io(_)), None) => Err(expired()),
            (Err(other), _) => Err(other),
        }
    }
}

/// A kept lock's end of validity, shared by its keeper and its holder: readable at every
/// instant without waiting for an extension round in flight (the holder may read it from any
/// thread while the keeper extends).
#[derive(Debug)]
pub(crate) struct KeptValidity {
    plan: Schedule,
    /// Set once the lock is lost; never cleared.
    lost: AtomicBool,
    /// The origin of `until`.
    base: Instant,
    /// The lock's end of validity, in nanoseconds after `base`. The keeper lowers it before
    /// each round to what that round may leave on the nodes, and sets it to the guard's own
    /// end of validity after.
    until: AtomicU64,
}

impl KeptValidity {
    /// A lock valid until `valid_until`, kept by `plan` from `now` on.
    pub fn new(plan: Schedule, now: Instant, valid_until: Instant) -> KeptValidity {
        let base = now;
        KeptValidity {
            plan,
            lost: AtomicBool::new(false),
            base,
            until: AtomicU64::new(nanos(valid_until.saturating_duration_since(base))),
        }
    }

    /// The schedule it is kept by.
    pub fn plan(&self) -> &Schedule {
        &self.plan
    }

    /// The validity left at `now`, or `None` once the lock is lost. The end of validity having
    /// passed is recorded as a loss, so that a lost lock stays lost even if an extension that
    /// won just in time is recorded afterwards.
    pub fn left(&self, now: Instant) -> Option<Duration> {
        if self.lost.load(Ordering::Acquire) {
            return None;
        }
        let until = Duration::from_nanos(self.until.load(Ordering::Acquire));
        let elapsed = now.saturating_duration_since(self.base);
        match until.checked_sub(elapsed).filter(|left| !left.is_zero()) {
            Some(left) => Some(left),
            None => {
                self.lost.store(true, Ordering::Release);
                None
            }
        }
    }

    /// The end of validity, as it stands.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn until(&self) -> Instant {
        self.base + Duration::from_nanos(self.until.load(Ordering::Acquire))
    }

    /// Whether the lock was found lost so far (by a read of its validity after its end, or by
    /// a round), without reading it now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn was_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The lock is lost, whatever its end of validity says.
    pub fn set_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// When the next extension is due, for the lock as it is at `now`.
    pub fn next_due(&self, now: Instant) -> Instant {
        self.plan
            .next_due(now, self.left(now).unwrap_or(Duration::ZERO))
    }

    /// An extension round is about to be sent at `now`: the end of validity is lowered to what
    /// the round may leave on the nodes, whatever comes of it (the holder reads it while the
    /// round is in flight). Refused once the lock is lost.
    pub fn round_starts(&self, now: Instant) -> Result<(), Error> {
        if self.left(now).is_none() {
            return Err(Error::ValidityExpired {
                elapsed: Duration::ZERO,
            });
        }
        if let Some(cap) = self.plan.cap_from(now) {
            self.lower_until(cap);
        }
        Ok(())
    }

    /// The extension round came to `result`, leaving the guard valid until `valid_until`, as
    /// of `now`: when to extend next, or why the lock is lost.
    pub fn round_ended(
        &self,
        result: Result<(), Error>,
        valid_until: Instant,
        now: Instant,
    ) -> Result<Instant, Error> {
        if result.is_ok() {
            let n = nanos(valid_until.saturating_duration_since(self.base));
            self.until.store(n, Ordering::Release);
        } else {
            self.lower_until(valid_until);
        }
        self.plan.after_round(result, now, self.left(now))
    }

    fn lower_until(&self, at: Instant) {
        let n = nanos(at.saturating_duration_since(self.base));
        self.until.fetch_min(n, Ordering::AcqRel);
    }
}

/// A duration in whole nanoseconds, saturated (`u64` nanoseconds last 584 years, longer than
/// any TTL).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn timing(ttl_ms: u64) -> Timing {
        Timing {
            ttl: Duration::from_millis(ttl_ms),
            drift_factor: 0.01,
        }
    }

    #[test]
    fn refuses_intervals_that_cannot_keep_the_lock() {
        let t = timing(1000);
        assert!(Schedule::new(t, Some(1000 * MS), 100 * MS, 50 * MS).is_err());
        assert!(Schedule::new(t, Some(Duration::ZERO), 100 * MS, 50 * MS).is_err());
        assert!(Schedule::new(timing(2), None, 100 * MS, 50 * MS).is_err());
        assert!(Schedule::new(t, None, 100 * MS, 50 * MS).is_ok());
    }

    #[test]
    fn extends_by_the_validity_left_not_only_by_the_interval() {
        // A 6 s TTL: interval 2 s, margin at least a third of the ~5.9 s validity.
        let s = Schedule::new(timing(6000), None, 100 * MS, 50 * MS).unwrap();
        let now = Instant::now();
        assert_eq!(s.next_due(now, 5900 * MS), now + 2000 * MS);
        // A lock with 600 ms left is below the margin: due at once.
        assert_eq!(s.next_due(now, 600 * MS), now);
    }

    #[test]
    fn unreachable_nodes_are_retried_while_the_validity_lasts_and_refusals_lose_the_lock() {
        let s = Schedule::new(timing(3000), None, 100 * MS, 50 * MS).unwrap();
        let now = Instant::now();
        let unreachable = || Error::QuorumUnreachable {
            quorum: 2,
            nodes: 3,
            failures: Vec::new(),
        };
        assert_eq!(
            s.after_round(Err(unreachable()), now, Some(50 * MS)),
            Ok(now + 50 * MS)
        );
        assert_eq!(
            s.after_round(Err(unreachable()), now, Some(500 * MS)),
            Ok(now + 100 * MS)
        );
        assert!(matches!(
            s.after_round(Err(unreachable()), now, None),
            Err(Error::ValidityExpired { .. })
        ));
        let refused = Error::Contended {
            refused: 2,
            nodes: 3,
            failures: Vec::new(),
        };
        assert_eq!(
            s.after_round(Err(refused.clone()), now, Some(500 * MS)),
            Err(refused)
        );
        assert!(matches!(
            s.after_round(Ok(()), now, None),
            Err(Error::ValidityExpired { .. })
        ));
    }
}
