//! The sans-IO lock engine: every lock operation, end to end, as a state machine.
//!
//! Nothing here touches a socket, reads the clock or draws randomness on its own: the caller
//! (the driver, or a simulation with virtual time) passes `now` into every call, and an
//! [`Entropy`](crate::rng::Entropy) into every call that may draw. What is in here:
//!
//! - `acquire`: an acquisition, attempts and retries included (where a retry happens);
//! - `hold`: a held lock's validity, and its extend and release rounds;
//! - `keepalive`: a kept lock's schedule of extensions, and the decision that it is lost;
//! - `machine`: what a driver sees of those machines, and the order it calls them in;
//! - `timings`: every deadline they keep (where a lock's deadline is computed);
//! - `kind`: which command each kind of lock sends at each step;
//! - `fanout`, [`Round`]: one command fanned out to N nodes, and the quorum decision;
//! - `retry`, [`Timing`]: the retry budget, and the arithmetic of validity;
//! - `ops`, `rw`, `fair`, `multi`, `fencing`: the commands and scripts, and what each reply
//!   means.
//!
//! A [`Round`] on its own is used in this order:
//!
//! 1. [`Round::new`] with the instant *before* the first byte is sent;
//! 2. for every reply, failure or late answer: [`Round::handle_vote`];
//! 3. whenever the deadline from [`Round::poll_timeout`] passes: [`Round::handle_timeout`];
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
mod sim;
mod timing;
pub(crate) mod timings;

pub use keys::KeyNames;
pub use retry::Retry;
pub use round::{quorum, Decision, Round, Vote};
pub use timing::Timing;

#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod tests;
