//! The sans-IO lock engine: every lock operation, end to end, as a state machine.
//!
//! Nothing here touches a socket, reads the clock or draws randomness on its own: the caller
//! (the driver, or a simulation with virtual time) passes `now` into every call, and an
//! [`Entropy`](crate::rng::Entropy) into every call that may draw. What is in here:
//!
//! - `endpoint`: the multiplexer's state, one per client: every node's connections, the
//!   replies owed and whom each belongs to, setup and server capabilities, the node-timeout
//!   policy, compare-and-deletes sent again after a broken connection, wake channels, the
//!   callers' mailboxes (where a reply is routed, and where a node counts as timed out);
//! - `acquire`: an acquisition, attempts and retries included (where a retry happens);
//! - `hold`: a held lock's extend and release rounds;
//! - `keepalive`: a kept lock's schedule of extensions, and the decision that it is lost;
//! - `machine`: what a driver sees of those machines, and the order it calls them in;
//! - `validity`, [`Timing`]: a lock's validity (the one place it is computed);
//! - `timings`: every other deadline (retries, waits, pauses, keep-alive);
//! - `retry`: the retry budget;
//! - `kind`: which command each kind of lock sends at each step;
//! - `fanout`, [`Round`]: one command fanned out to N nodes, and the quorum decision;
//! - `ops`, `rw`, `fair`, `multi`, `fencing`, `sem`: the commands and scripts, and what each
//!   reply means; `scripts`: the Lua they run; `keys`: the Redis keys each kind uses;
//! - `sim` (tests only): the deterministic simulation that runs all of the above.
//!
//! A [`Round`] on its own is used in this order:
//!
//! 1. [`Round::new`] with the instant *before* the first byte is sent;
//! 2. for every reply, failure (a node that timed out is one) or late answer:
//!    [`Round::handle_vote`];
//! 3. whenever the deadline from [`Round::poll_timeout`] (the validity) passes:
//!    [`Round::handle_timeout`];
//! 4. [`Round::decision`] after each input; once it is `Some`, it never changes.
#![forbid(unsafe_code)]

pub(crate) mod acquire;
pub(crate) mod endpoint;
pub(crate) mod fair;
mod fanout;
pub(crate) mod fencing;
pub(crate) mod hold;
pub(crate) mod keepalive;
pub(crate) mod keys;
pub(crate) mod kind;
pub(crate) mod machine;
pub(crate) mod multi;
pub mod ops;
mod retry;
mod round;
pub(crate) mod rw;
pub(crate) mod scripts;
pub(crate) mod sem;
#[cfg(test)]
pub(crate) mod sim;
pub(crate) mod timings;
pub(crate) mod validity;

pub use keys::KeyNames;
pub use retry::Retry;
pub use round::{quorum, Decision, Round, Vote};
pub use validity::Timing;

#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod tests;
