//! The sans-IO core: one command fanned out to N nodes, and the quorum decision over their
//! replies.
//!
//! Nothing here touches a socket or reads the clock. The caller (the driver, or a test with
//! virtual time) passes `now` into every call. A [`Round`] is used in this order:
//!
//! 1. [`Round::new`] with the instant *before* the first byte is sent;
//! 2. for every reply, failure or late answer: [`Round::handle_vote`];
//! 3. whenever the deadline from [`Round::poll_timeout`] passes: [`Round::handle_timeout`];
//! 4. [`Round::decision`] after each input; once it is `Some`, it never changes.
//!
//! The lock algorithms (which command each node gets, and what each reply means) are in
//! the crate-private `ops` module; the arithmetic of validity is in [`Timing`].
#![forbid(unsafe_code)]

#[macro_use]
pub(crate) mod fair;
pub(crate) mod fencing;
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
