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
#[macro_use]
pub(crate) mod fair;
mod fanout;
pub(crate) mod fencing;
pub(crate) mod hold;
pub(crate) mod keepalive;
pub(crate) mod kind;
pub(crate) mod machine;
pub(crate) mod multi;
pub mod ops;
mod retry;
mod round;
pub(crate) mod rw;
#[cfg(test)]
mod sim;
mod timing;
pub(crate) mod timings;

pub use retry::Retry;
pub use round::{quorum, Decision, Round, Vote};
pub use timing::Timing;

/// The Redis keys this library keeps for one resource key, for tools that look at them (such as
/// `redlock-mux inspect`). Every name shares the resource key's Redis Cluster hash slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNames {
    /// The mutex (and all-or-none) key: the resource key itself, holding the holder's token.
    pub mutex: Vec<u8>,
    /// The mutex's fair queue: waiters' ids (each waiter's first token) scored by ticket.
    pub mutex_queue: Vec<u8>,
    /// The mutex's fair queue entries scored by their expiry, in ms on the node's clock.
    pub mutex_queue_expiries: Vec<u8>,
    /// The read-write lock's writer key.
    pub writer: Vec<u8>,
    /// The read-write lock's readers, scored by their expiry in ms on the node's clock.
    pub readers: Vec<u8>,
    /// Waiting writers' intents (write-preferring policy): their ids, scored like readers.
    pub intents: Vec<u8>,
    /// The read-write lock's fair queue: `r` or `w` followed by the waiter's id, scored by
    /// ticket.
    pub rw_queue: Vec<u8>,
    /// The read-write lock's fair queue entries scored by their expiry.
    pub rw_queue_expiries: Vec<u8>,
}

impl KeyNames {
    /// The names for resource `key`.
    pub fn new(key: &[u8]) -> KeyNames {
        let queue = |which| {
            let mut bulk = Vec::new();
            fair::write_queue_key(&mut bulk, key, which);
            // A bulk string: keep what lies between its header line and the final CRLF.
            let start = bulk.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            bulk[start..bulk.len() - 2].to_vec()
        };
        let rw = rw::RwKeys::new(key);
        KeyNames {
            mutex: key.to_vec(),
            mutex_queue: queue(0),
            mutex_queue_expiries: queue(1),
            writer: rw.writer().to_vec(),
            readers: rw.readers().to_vec(),
            intents: rw.intents().to_vec(),
            rw_queue: rw.queue().to_vec(),
            rw_queue_expiries: rw.queue_expiries().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests;
