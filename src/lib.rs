//! # redlock-mux
//!
//! Redlock distributed locks over N independent Redis masters, for blocking programs.
//!
//! Each operation writes its command to all N nodes at once over non-blocking sockets, and
//! returns as soon as a quorum (`N / 2 + 1`) has answered: one round trip to the fastest
//! majority, not N sequential ones. There is no async runtime. A client has at most two
//! threads of its own: the one that keeps locks alive, started when a lock is first kept alive,
//! and one that sees releases through to the nodes that answer after the release returned,
//! started the first time one does and parked while nothing is owed.
//!
//! What is in scope:
//! - the Redlock mutex of antirez's specification ([`Client::lock`], [`Lock`]): acquire with
//!   `SET NX PX`, validity of `ttl − elapsed − drift`, cleanup on every node after a failed
//!   attempt, jittered retries, extension within the validity, release by compare-and-delete;
//! - read-write locks ([`Client::read_lock`], [`Client::write_lock`], [`RwPolicy`]),
//!   all-or-none locks on several keys ([`Client::lock_all`]) and fencing tokens for the mutex
//!   and the write lock ([`Client::lock_fenced`], [`Client::write_lock_fenced`]);
//! - for every kind of lock: one attempt (`try_*`) or waiting without polling (releases are
//!   announced over pub/sub), a FIFO-fair policy ([`ClientBuilder::fair`]), extension, release
//!   on drop, and auto-extension with a notice when the lock is lost ([`Guard::keep_alive`],
//!   [`Client::with_lock`]); every guard is a [`Guard`] of some [`kind`];
//! - a C API (`include/redlock_mux.h`);
//! - a sans-IO RESP2 codec ([`resp`]), usable on its own, and, for tools that look at the nodes
//!   themselves, [`KeyNames`] (the Redis keys each lock kind keeps) and [`NodeUrl`] (node URLs
//!   read as the client reads them, shown without their passwords).
//!
//! Nodes are reached over TCP, over TLS (`rediss://` URLs, with the `tls` cargo feature, off by
//! default: rustls with the ring provider, the system's roots and
//! [`ClientBuilder::tls_ca_file`]) or over Unix domain sockets (`unix:///path/to/redis.sock`);
//! a quorum member may also be a whole Redis Cluster (`redis+cluster://`), one vote cast by the
//! master of the lock's slot, with `MOVED` and `ASK` followed; see [`ClientBuilder::nodes`].
//!
//! What is not: Sentinel failover, RESP3, and any safety beyond what Redlock's timing
//! assumptions give (see the README's "Guarantees and their limits").
//!
//! Layers, from the bottom:
//! - [`resp`], the codec, and the lock engine (crate-private) never touch a socket, read the
//!   clock or draw randomness on their own. The engine holds every lock operation end to end
//!   as a state machine (the attempts and retries of an acquisition, the extend and release
//!   rounds, the keep-alive schedule) and the *endpoint*: every node's connections and every
//!   decision about them (what is owed, setup, redirections, backoff, wake channels);
//! - a thin mio driver makes the system calls the endpoint asks for over TCP, TLS or Unix
//!   sockets, and parks and wakes the threads that share a client;
//! - the [`Client`] and its one [`Guard`] are the API; the keeper thread runs the keep-alive
//!   schedule; the C API sits at the edge.
//!
//! Every setting lives in one leaf module that the driver and the engine read without knowing
//! the client.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod config;
mod driver;
mod engine;
mod error;
mod guard;
mod keepalive;
mod keeper;
mod names;
mod options;
mod process;
pub mod resp;
mod rng;
mod semaphore;
mod sha1;
mod stats;
mod tls;
mod url;

pub use client::{Client, ClientBuilder};
pub use config::{RwPolicy, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS, MAX_NODES, MAX_TTL};
pub use engine::KeyNames;
pub use error::{Deadline, Error, InvalidArgument, NodeErrorKind, NodeFailure, TlsFailure};
pub use guard::{
    kind, FencedLock, FencedWriteLock, Guard, Lock, MultiLock, Permit, ReadLock, WriteLock,
};
pub use keepalive::{KeepAlive, KeepAliveError, KeptLock, Lost};
pub use options::{Acquire, Cancel};
pub use semaphore::{Semaphore, MAX_PERMITS};
pub use stats::{KindStats, NodeFailures, NodeStats, RoundStats, Stats, LATENCY_WINDOW};
pub use url::NodeUrl;

/// Pieces of the sans-IO engine that the fuzz targets and benchmarks drive directly. Not part
/// of the API: anything here may change in any release.
#[doc(hidden)]
pub mod internals {
    pub use crate::engine::ops::{Acquire, Extend, Op, Release, ScriptForm, Verdict};
    pub use crate::engine::{quorum, Decision, Round, Timing, Vote};

    /// The fencing write-back script, as nodes are sent it (its text is the code of
    /// `fence_write.lua`, without comments): for tests that tell it apart in `MONITOR`.
    pub use crate::engine::scripts::{Script, FENCE_WRITE};

    // For the C API (capi/, a package of its own).

    /// The length of a lock's token, in bytes.
    pub const TOKEN_LEN: usize = crate::rng::TOKEN_LEN;

    /// The kind of an [`Error`](crate::Error), without its details. Matched here without a
    /// wildcard, where `#[non_exhaustive]` does not apply: a new kind of error fails to compile
    /// until it is added, and then fails the C API's match until the C API gives it a number.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ErrorKind {
        InvalidArgument,
        Contended,
        QuorumUnreachable,
        ValidityExpired,
        Io,
        Config,
        WaitEnded,
        Cancelled,
        Undelivered,
        OtherProcess,
    }

    impl ErrorKind {
        /// The kind of `error`.
        pub fn of(error: &crate::Error) -> ErrorKind {
            use crate::Error as E;
            match error {
                E::InvalidArgument(_) => ErrorKind::InvalidArgument,
                E::Contended { .. } => ErrorKind::Contended,
                E::QuorumUnreachable { .. } => ErrorKind::QuorumUnreachable,
                E::ValidityExpired { .. } => ErrorKind::ValidityExpired,
                E::Io(_) => ErrorKind::Io,
                E::Config { .. } => ErrorKind::Config,
                E::WaitEnded { .. } => ErrorKind::WaitEnded,
                E::Cancelled => ErrorKind::Cancelled,
                E::Undelivered { .. } => ErrorKind::Undelivered,
                E::OtherProcess { .. } => ErrorKind::OtherProcess,
            }
        }
    }

    /// A [`Deadline`](crate::Deadline), matched without a wildcard for the same reason.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum DeadlineKind {
        WaitTimeout,
        RetryCount,
        Validity,
        NodeTimeout,
    }

    impl DeadlineKind {
        /// The kind of `deadline`.
        pub fn of(deadline: crate::Deadline) -> DeadlineKind {
            use crate::Deadline as D;
            match deadline {
                D::WaitTimeout => DeadlineKind::WaitTimeout,
                D::RetryCount => DeadlineKind::RetryCount,
                D::Validity => DeadlineKind::Validity,
                D::NodeTimeout => DeadlineKind::NodeTimeout,
            }
        }
    }
}

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
