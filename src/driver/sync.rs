//! The driver's synchronization and its clock, in one place: the standard library's in a normal
//! build, the concurrency checker's in a test build with `--cfg shuttle` (see
//! [`checker`](super::checker)).
//!
//! Every thread hand-off of the driver goes through these: the core's mutex, parking and
//! unparking callers (and the resender), starting the resender, the flag of a child's core
//! that was not warmed up, the time that deadlines are judged by, and the poller with its
//! waker. [`park_follower`] is [`park_timeout`] for a caller that waits while another leads: the
//! checker tells it apart, so that it can say when a caller parks while nobody leads.
#![forbid(unsafe_code)]

#[cfg(not(all(test, shuttle)))]
mod imp {
    use std::io;
    use std::time::{Duration, Instant};

    pub(crate) use mio::{Events, Poll, Registry, Waker};
    pub(crate) use std::sync::atomic::AtomicBool;
    pub(crate) use std::sync::{Mutex, MutexGuard, TryLockError};
    pub(crate) use std::thread::{current, park_timeout, sleep, Thread};

    /// The time deadlines are judged by.
    #[inline]
    pub(crate) fn now() -> Instant {
        Instant::now()
    }

    /// Parks a caller that waits while another caller leads (see the module's documentation).
    #[inline]
    pub(crate) fn park_follower(timeout: Duration) {
        park_timeout(timeout);
    }

    /// Starts a thread named `name` that runs `f`.
    pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(drop)
    }
}

#[cfg(all(test, shuttle))]
mod imp {
    pub(crate) use super::super::checker::net::{Events, Poll, Registry, Waker};
    pub(crate) use super::super::checker::world::{
        current, now, park_follower, park_timeout, sleep, spawn, Thread,
    };
    pub(crate) use shuttle::sync::atomic::AtomicBool;
    pub(crate) use shuttle::sync::{Mutex, MutexGuard};
    pub(crate) use std::sync::TryLockError;
}

pub(crate) use imp::*;

/// A cancel handle as the driver sees it (the lock API's `Cancel` is one): a flag read at every
/// turn, and the wake-ups it owes the operations that wait with it.
pub(crate) trait Cancellable {
    /// Whether the operation was cancelled.
    fn is_cancelled(&self) -> bool;
    /// Wakes `waker` and unparks `thread` when cancelled, until [`unregister`] with the id
    /// returned. Registered before the flag is read, so a cancel is never missed between the
    /// two.
    ///
    /// [`unregister`]: Cancellable::unregister
    fn register(&self, waker: Option<std::sync::Arc<Waker>>, thread: Thread) -> u64;
    /// Forgets the registration `id`.
    fn unregister(&self, id: u64);
}

/// An operation registered with a [`Cancellable`], until dropped (a panic that unwinds the
/// operation included).
pub(crate) struct Registration<'a> {
    cancel: &'a dyn Cancellable,
    id: u64,
}

impl<'a> Registration<'a> {
    /// Registers `waker` and `thread` with `cancel` (see [`Cancellable::register`]).
    pub fn new(
        cancel: &'a dyn Cancellable,
        waker: Option<std::sync::Arc<Waker>>,
        thread: Thread,
    ) -> Registration<'a> {
        let id = cancel.register(waker, thread);
        Registration { cancel, id }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.cancel.unregister(self.id);
    }
}
