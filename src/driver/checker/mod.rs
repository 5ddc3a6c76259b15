//! The driver's thread hand-off under a concurrency checker.
//!
//! Built only for the library's tests with `--cfg shuttle` (`bash .ci/checker`, its own CI
//! step): then [`sync`](super::sync) is this module's threads, clock and poller, and the
//! driver's sockets are [`net`]'s in-memory connections to the simulation's servers. The
//! driver's own code runs unchanged on top: the core's mutex, leader election, posting to
//! callers and unparking them, the resender thread, `close()` while others drive, and the
//! cancel handles' wake-ups.
//!
//! # Why shuttle
//!
//! [shuttle](https://docs.rs/shuttle) explores schedules at random and with PCT (probabilistic
//! concurrency testing, which finds a bug of depth *d* with a known probability per run),
//! and scales to the runs here: a client's build and warm-up, five threads, each with several
//! operations over three nodes, thousands of scheduling points per run. loom explores every
//! schedule within bounds, which is exhaustive but blows up beyond two or three threads with a
//! few hundred operations each, and bounds its thread count; what the hand-off must survive is
//! several callers, a resender and a closer at once.
//!
//! # Time
//!
//! shuttle does not model time: its `park_timeout` is `park`. The driver's waits all have
//! deadlines, so the checker keeps a virtual clock ([`world`]) that moves only when every
//! thread of the run waits (parked, polling or sleeping), to the first deadline among them (or
//! the next reply of a slow node). So a timeout fires only once nothing else can happen, and
//! a lost wake-up shows as a caller that sleeps until its own deadline, which the tests
//! measure in virtual time. At each such moment the checker also asserts that no caller is
//! parked as a follower while no thread polls (a caller parked with nobody leading), and it
//! counts the moves of the clock: a loop that only ever waits a little is a busy loop. A
//! deadlock (every thread waits, none with a deadline) and a run of more than shuttle's step
//! limit without waiting fail too.
//!
//! # What it cannot express
//!
//! - A timeout that fires while another thread still runs: time moves only at quiescence, so
//!   a race between a reply and a deadline is explored only where every thread waits at once
//!   (the simulation covers those races between replies and timers on one thread).
//! - Weak memory: shuttle runs one thread at a time, sequentially consistent; the driver's
//!   shared state is all under the core's mutex, and its atomics (the cancel flag, a child's
//!   warm-up flag) are SeqCst or AcqRel.
//! - The kernel: a socket's partial writes, a poller's spurious or coalesced events, a
//!   connection reset. The in-memory network takes every write whole and raises one edge per
//!   arrival; the driver's handling of the socket is tested against real servers.
//! - TLS (the checker is built without the `tls` feature), and the `Client` code outside the
//!   driver that reads the real clock (a lock's validity): the tests use TTLs long enough for
//!   the difference not to matter.
//! - `fork()`. shuttle runs a test's threads as coroutines of one process, and a fork copies
//!   only the thread that calls it: the state that matters (a mutex copied locked by a thread
//!   that does not exist in the child, a child's core made from its parent's) is not a
//!   schedule of threads. The per-process check ([`PerProcess`](crate::process::PerProcess))
//!   takes no lock, and the child's core is made with `try_lock` on the parent's, never a
//!   wait; what a child does is tested by forking real processes: `tests/fork_children.rs`
//!   (a child whose parent's thread held the core at the fork, a child of a child, the
//!   resender per process) and `tests/audit_fork.rs` (the child never touches its parent's
//!   sockets, counted with the system calls it makes).

pub(crate) mod net;
pub(crate) mod world;

use std::sync::{Arc, Weak};

use super::Local;

/// Has the world ask, whenever every thread waits, which callers `local` marks as not
/// parked: a caller parked as a follower that is one of them was posted to, and nobody is
/// left to unpark it (a lost wake-up).
pub(super) fn watch(local: &Arc<Local>) {
    let weak: Weak<Local> = Arc::downgrade(local);
    world::World::get().watch(Box::new(move || {
        weak.upgrade()
            .map(|local| local.lock().marked_awake())
            .unwrap_or_default()
    }));
}

#[cfg(test)]
mod tests;
