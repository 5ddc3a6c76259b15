//! What belongs to one process: a client used in a child after `fork()` gets its own.
//!
//! A child has only the thread that forked; every other thread of its parent is gone, and so
//! is whatever they were doing. A lock one of them held at the fork is copied locked, and stays
//! so forever; a value one of them was changing is copied half-changed. So a child must never
//! wait on its parent's locks, nor use or drop its parent's values: [`PerProcess`] gives each
//! process a value of its own, made on its first use there, and reaches it without taking any
//! lock of another process.
#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};

/// A value for each process that uses it: the one it was made with, for the process that
/// made it, and one made on first use in each process forked from there (and from those, in
/// turn).
///
/// The values form a chain, one per process of the line of forks: each process reads its
/// ancestors' process ids, which never change, and never their values. Only a process's own
/// value is ever dropped; its ancestors' are left as they are (their memory is only a copy, and
/// their threads do not exist here).
pub(crate) struct PerProcess<T> {
    pid: u32,
    value: Arc<T>,
    /// The value of the process forked from this one, in that process's copy of the memory
    /// (and so on down the line). Only ever set in a process forked from `pid`.
    forked: OnceLock<Box<PerProcess<T>>>,
}

impl<T> PerProcess<T> {
    /// `value`, for this process.
    pub fn new(value: T) -> PerProcess<T> {
        PerProcess {
            pid: std::process::id(),
            value: Arc::new(value),
            forked: OnceLock::new(),
        }
    }

    /// The value of the process that made it (the concurrency checker watches it).
    #[cfg(all(test, shuttle))]
    pub fn first(&self) -> &Arc<T> {
        &self.value
    }

    /// The value of the process that calls: in a process forked from the one that made it, one
    /// is made with `make` at its first use there, given the value of the nearest ancestor
    /// (which it must only look at without waiting on it). An error from `make` is returned,
    /// and the next call tries again.
    pub fn here<E>(&self, make: impl FnOnce(&T) -> Result<T, E>) -> Result<&T, E> {
        let me = std::process::id();
        let mut at = self;
        let mut make = Some(make);
        // One step per process in the line of forks from the maker to this one, and one more
        // after making this process's value: bounded.
        loop {
            if at.pid == me {
                return Ok(&at.value);
            }
            match at.forked.get() {
                Some(next) => at = next,
                None => {
                    let Some(make) = make.take() else {
                        // Cannot happen: what was set is there on the next step.
                        return Ok(&at.value);
                    };
                    let value = make(&at.value)?;
                    // Another thread of this process may have made one first: then this one
                    // is dropped, and that one used.
                    let _ = at.forked.set(Box::new(PerProcess::new(value)));
                }
            }
        }
    }
}

impl<T> Drop for PerProcess<T> {
    /// A value of another process (an ancestor of this one) is left alone: one of its threads,
    /// gone here, may have been changing it at the fork. It costs the memory, and whatever
    /// descriptors it holds, for the rest of this process.
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            std::mem::forget(Arc::clone(&self.value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maker_gets_its_own_value_and_nothing_is_made() {
        let p = PerProcess::new(7);
        let got = p.here(|_| Err::<i32, ()>(())).unwrap();
        assert_eq!(*got, 7);
    }
}
