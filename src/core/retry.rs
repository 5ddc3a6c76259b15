//! When to try again after a lost acquisition round: the retry count and the wait timeout of
//! Redlock's retry loop, without the clock or the randomness (the caller brings both).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// The retry budget of one acquisition, from its first attempt.
///
/// After each lost round the caller broadcasts the cleanup, draws a jittered delay, and asks
/// [`next_attempt`](Self::next_attempt) when to try again; `None` means give up now.
#[derive(Debug, Clone)]
pub struct Retry {
    deadline: Instant,
    lost: u32,
    retry_count: u32,
    wait: bool,
}

impl Retry {
    /// The budget of an acquisition whose first attempt starts at `first`: at most
    /// `retry_count` retries, none starting at or after `first + wait_timeout`, and none at all
    /// unless `wait`.
    pub fn new(first: Instant, wait_timeout: Duration, retry_count: u32, wait: bool) -> Retry {
        Retry {
            deadline: first.checked_add(wait_timeout).unwrap_or(first),
            lost: 0,
            retry_count,
            wait,
        }
    }

    /// Records a lost round at `now`; returns when to start the next attempt (`now + delay`),
    /// or `None` when the budget is spent.
    #[must_use]
    pub fn next_attempt(&mut self, now: Instant, delay: Duration) -> Option<Instant> {
        self.lost = self.lost.saturating_add(1);
        let next = now.checked_add(delay)?;
        (self.wait && self.lost <= self.retry_count && next < self.deadline).then_some(next)
    }

    /// Time left before the wait timeout, from `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }

    /// How many rounds were lost so far.
    pub fn lost(&self) -> u32 {
        self.lost
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
        assert_eq!(r.next_attempt(t0 + 20 * MS, 10 * MS), Some(t0 + 30 * MS));
        assert_eq!(r.next_attempt(t0 + 40 * MS, 10 * MS), None);
        assert_eq!(r.lost(), 3);

        let mut r = Retry::new(t0, 100 * MS, 10, true);
        assert_eq!(r.next_attempt(t0 + 80 * MS, 19 * MS), Some(t0 + 99 * MS));
        assert_eq!(r.next_attempt(t0 + 80 * MS, 20 * MS), None);

        let mut r = Retry::new(t0, 100 * MS, 10, false);
        assert_eq!(r.next_attempt(t0, MS), None);
    }
}
