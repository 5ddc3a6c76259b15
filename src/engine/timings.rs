//! Every deadline the engine keeps but a lock's validity (which `validity` computes), in one
//! place.
//!
//! A lock operation waits on several clocks at once: each node's reply (the per-node timeout),
//! the validity a round must be won within, the backstop retry and the wait timeout of a
//! waiting acquisition, the pauses after split votes, the confirmation of subscriptions, a kept
//! lock's next extension. This module computes each of them from the settings and the instants
//! the caller passes in, and keeps them in order, so that a state machine has one deadline at a
//! time, the earliest:
//!
//! - a round in flight waits for its finish-by instant (its validity, and an extend's current
//!   validity); the per-node deadline is the endpoint's, which fails a node that has not
//!   answered [`node_deadline`] after its command was written;
//! - a waiting acquisition's backstop is kept short of the wait deadline ([`backstop_delay`]),
//!   and a pause after a split vote ends by the backstop ([`pause_until`]);
//! - a kept lock's next extension comes by the interval or by the validity left, whichever is
//!   first ([`keep_alive_due`]).
//!
//! Which one fired is in the outcome: a round that ran out its finish-by is lost as
//! `ValidityExpired` ([`Deadline::Validity`](crate::Deadline::Validity)); one decided when the
//! per-node deadline passed has `Timeout` failures
//! ([`Deadline::NodeTimeout`](crate::Deadline::NodeTimeout)); a wait that ends says whether the
//! wait timeout or the retry count ended it (`Error::WaitEnded`).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::config::{Config, MAX_TTL};
use crate::rng::Entropy;

/// When a node that has not answered a round started at `start` counts as failed.
pub fn node_deadline(start: Instant, node_timeout: Duration) -> Instant {
    start.checked_add(node_timeout).unwrap_or(start)
}

/// The end of a waiting acquisition whose first attempt started at `first`: no attempt starts
/// at or after it.
pub fn wait_deadline(first: Instant, wait_timeout: Duration) -> Instant {
    first.checked_add(wait_timeout).unwrap_or(first)
}

/// How long, and how many times, a waiting acquisition may retry: the client's settings, or
/// those of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitLimits {
    /// No attempt starts this long after the first one, or later.
    pub wait_timeout: Duration,
    /// No attempt starts at or after this instant either, when set.
    pub deadline: Option<Instant>,
    /// How many retries may come after a backstop (see [`Retry`](crate::engine::Retry)).
    pub retry_count: u32,
}

impl WaitLimits {
    /// The client's settings.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn of(config: &Config) -> WaitLimits {
        WaitLimits {
            wait_timeout: config.wait_timeout,
            deadline: None,
            retry_count: config.retry_count,
        }
    }
}

/// The end of a waiting acquisition whose first attempt started at `first`, within `limits`:
/// the earlier of its wait timeout and its deadline. No attempt starts at or after it.
pub fn wait_end(first: Instant, limits: &WaitLimits) -> Instant {
    let end = wait_deadline(first, limits.wait_timeout);
    limits.deadline.map_or(end, |d| d.min(end))
}

/// The first window over which a waiter spreads its retry after a split vote: about one round
/// trip on a local network. It doubles with each split, up to [`SPREAD_MAX`].
pub const SPREAD_MIN: Duration = Duration::from_micros(200);
/// The widest window of retries after split votes (and never wider than the retry delay).
pub const SPREAD_MAX: Duration = Duration::from_millis(4);

/// The delay after which a lost attempt is retried if no release is announced (the backstop):
/// drawn from `[d/2, 3d/2)` for a retry delay `d`, and kept [`SPREAD_MIN`] short of the wait
/// timeout (`remaining` from now), so that a waiter still gets a last try.
pub fn backstop_delay(
    rng: &mut dyn Entropy,
    retry_delay: Duration,
    remaining: Duration,
) -> Duration {
    rng.around(retry_delay)
        .min(remaining.saturating_sub(SPREAD_MIN))
}

/// The window of retries after another split vote: doubled, within its bounds.
pub fn spread_after_split(spread: Duration, retry_delay: Duration) -> Duration {
    (spread * 2).clamp(SPREAD_MIN, SPREAD_MAX.min(retry_delay).max(SPREAD_MIN))
}

/// When the next attempt comes after a random pause within `spread` from `now`: never after
/// the `backstop`.
pub fn pause_until(
    rng: &mut dyn Entropy,
    spread: Duration,
    now: Instant,
    backstop: Instant,
) -> Instant {
    now.checked_add(rng.below(spread))
        .unwrap_or(backstop)
        .min(backstop)
}

/// The spread that an acquisition hands to the next one on its driver: as learnt if it saw a
/// split vote, halved otherwise, and zero once below [`SPREAD_MIN`].
pub fn learnt_spread(spread: Duration, split_seen: bool) -> Duration {
    let s = if split_seen { spread } else { spread / 2 };
    if s < SPREAD_MIN {
        Duration::ZERO
    } else {
        s
    }
}

/// How long subscriptions to wake channels may take to be confirmed before the waiter goes on
/// without them (a lost subscriber only costs wake-ups: the backstop remains).
pub fn subscribed_by(now: Instant, node_timeout: Duration) -> Instant {
    node_deadline(now, node_timeout)
}

/// How long a fair queue entry lives without a retry refreshing it, in ms: three retry
/// delays (the longest backstop is 1.5 of them) plus a node timeout, and at least 100 ms.
pub fn queue_entry_ttl_ms(config: &Config) -> u64 {
    let ttl = (config.retry_delay * 3 + config.node_timeout).max(Duration::from_millis(100));
    ttl.as_millis().min(MAX_TTL.as_millis()) as u64
}

/// How long a waiting writer's intent lives without a retry refreshing it, in ms (the
/// write-preferring policy): twice the retry delay plus twice the node timeout.
pub fn intent_ttl_ms(config: &Config) -> u64 {
    (2 * (config.retry_delay + config.node_timeout)).as_millis() as u64
}

/// The validity left below which a kept lock's next extension is due: time for a round that
/// times out and a retry (twice the node timeout plus the retry delay), but at least a third
/// and at most two thirds of the `validity` an extension gives.
pub fn keep_alive_margin(node_timeout: Duration, retry: Duration, validity: Duration) -> Duration {
    node_timeout
        .saturating_mul(2)
        .saturating_add(retry)
        .clamp(validity / 3, validity / 3 * 2)
}

/// When a kept lock with `left` of validity at `now` is next extended: one `interval` on, or
/// earlier, when the validity left falls to the `margin`.
pub fn keep_alive_due(
    now: Instant,
    interval: Duration,
    left: Duration,
    margin: Duration,
) -> Instant {
    now.checked_add(interval.min(left.saturating_sub(margin)))
        .unwrap_or(now)
}

/// When a kept lock's extension that failed for a reason that may pass is tried again: one
/// `retry` delay on, but before the `left` validity runs out.
pub fn keep_alive_retry(now: Instant, retry: Duration, left: Duration) -> Instant {
    now.checked_add(retry.min(left)).unwrap_or(now)
}
