//! When to try again after a lost acquisition round: the retry count and the wait timeout of
//! Redlock's retry loop, without the clock or the randomness (the caller brings both).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::error::Deadline;

/// The retry budget of one acquisition, from its first attempt.
///
/// After each lost round the caller broadcasts the cleanup, draws a jittered delay, and asks
/// [`next_attempt`](Self::next_attempt) for the latest instant to try again (the backstop);
/// `None` means give up now. A waiter that is told of a release may try again sooner. Only
/// retries that start because their backstop passed count against the retry count: the caller
/// says so with [`count_retry`](Self::count_retry). Retries that a release announcement
/// prompts are bounded by the wait timeout alone, so a waiter is never sent away by the
/// number of other waiters served before it.
#[derive(Debug, Clone)]
pub struct Retry {
    deadline: Instant,
    counted: u32,
    retry_count: u32,
    wait: bool,
}

impl Retry {
    /// The retry count that means no limit: only the wait timeout ends the waiting.
    pub const UNLIMITED: u32 = u32::MAX;

    /// The budget of an acquisition whose first attempt starts at `first`: at most
    /// `retry_count` counted retries ([`UNLIMITED`](Self::UNLIMITED): any number), none
    /// starting at or after `first + wait_timeout`, and none at all unless `wait`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(first: Instant, wait_timeout: Duration, retry_count: u32, wait: bool) -> Retry {
        Retry {
            deadline: crate::engine::timings::wait_deadline(first, wait_timeout),
            counted: 0,
            retry_count,
            wait,
        }
    }

    /// The budget of an acquisition that may not start an attempt at or after `deadline`:
    /// at most `retry_count` counted retries, and none at all unless `wait`.
    pub fn until(deadline: Instant, retry_count: u32, wait: bool) -> Retry {
        Retry {
            deadline,
            counted: 0,
            retry_count,
            wait,
        }
    }

    /// After a lost round at `now`: returns the latest instant the next attempt starts at
    /// (`now + delay`, its backstop), or `None` when the budget is spent: waiting is not
    /// allowed, the backstop is not before the wait timeout, or the retry count is used up.
    #[must_use]
    pub fn next_attempt(&mut self, now: Instant, delay: Duration) -> Option<Instant> {
        let next = now.checked_add(delay)?;
        let counts_left = self.retry_count == Self::UNLIMITED || self.counted < self.retry_count;
        (self.wait && counts_left && next < self.deadline).then_some(next)
    }

    /// Counts the retry about to start against the retry count: it starts because its
    /// backstop passed, with no release announced.
    pub fn count_retry(&mut self) {
        self.counted = self.counted.saturating_add(1);
    }

    /// Which limit ended the waiting, once [`next_attempt`](Self::next_attempt) said to give
    /// up: `None` when waiting was not allowed at all (one attempt only).
    pub fn ended_by(&self) -> Option<Deadline> {
        if !self.wait {
            None
        } else if self.retry_count != Self::UNLIMITED && self.counted >= self.retry_count {
            Some(Deadline::RetryCount)
        } else {
            Some(Deadline::WaitTimeout)
        }
    }

    /// Time left before the wait timeout, from `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn stops_at_the_retry_count_or_the_wait_timeout() {
        let t0 = Instant::now();
        let mut r = Retry::new(t0, 1000 * MS, 2, true);
        assert_eq!(r.next_attempt(t0, 10 * MS), Some(t0 + 10 * MS));
        r.count_retry();
        assert_eq!(r.next_attempt(t0 + 20 * MS, 10 * MS), Some(t0 + 30 * MS));
        r.count_retry();
        assert_eq!(r.next_attempt(t0 + 40 * MS, 10 * MS), None);
        assert_eq!(r.ended_by(), Some(Deadline::RetryCount));

        let mut r = Retry::new(t0, 100 * MS, 10, true);
        assert_eq!(r.next_attempt(t0 + 80 * MS, 19 * MS), Some(t0 + 99 * MS));
        assert_eq!(r.next_attempt(t0 + 80 * MS, 20 * MS), None);
        assert_eq!(r.ended_by(), Some(Deadline::WaitTimeout));

        let mut r = Retry::new(t0, 100 * MS, 10, false);
        assert_eq!(r.next_attempt(t0, MS), None);
        assert_eq!(r.ended_by(), None, "one attempt is no wait");

        let mut r = Retry::new(t0, 100 * MS, 0, true);
        assert_eq!(
            r.next_attempt(t0, MS),
            None,
            "a count of zero never retries"
        );
    }

    #[test]
    fn only_counted_retries_spend_the_retry_count() {
        let t0 = Instant::now();
        let mut r = Retry::new(t0, 1000 * MS, 1, true);
        // Retries prompted by releases: as many as the wait timeout allows.
        for i in 0..100 {
            assert_eq!(r.next_attempt(t0 + i * MS, MS), Some(t0 + (i + 1) * MS));
        }
        r.count_retry();
        assert_eq!(r.next_attempt(t0 + 200 * MS, MS), None);

        let mut r = Retry::new(t0, 1000 * MS, Retry::UNLIMITED, true);
        for _ in 0..1000 {
            assert!(r.next_attempt(t0, MS).is_some());
            r.count_retry();
        }
        assert_eq!(r.next_attempt(t0 + 999 * MS, MS), None, "the wait timeout");
    }
}
