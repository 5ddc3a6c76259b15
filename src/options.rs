//! Per-call options of a waiting acquisition ([`Acquire`]) and the handle that cancels one
//! ([`Cancel`]).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use crate::driver::sync::{AtomicBool, Cancellable, Mutex, MutexGuard, Thread, Waker};
use crate::error::InvalidArgument;
use crate::process::PerProcess;

/// The longest per-call timeout, as for the client's settings: a day.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How one waiting acquisition waits, in place of the client's settings: a timeout or a
/// deadline, a retry count, and a [`Cancel`] handle. Every option left unset keeps the
/// client's setting ([`wait_timeout`](crate::ClientBuilder::wait_timeout),
/// [`retry_count`](crate::ClientBuilder::retry_count)).
///
/// Given to the `*_with` calls of every lock kind ([`Client::lock_with`](crate::Client::lock_with),
/// [`read_lock_with`](crate::Client::read_lock_with), [`write_lock_with`](crate::Client::write_lock_with),
/// [`lock_all_with`](crate::Client::lock_all_with), [`lock_fenced_with`](crate::Client::lock_fenced_with),
/// [`write_lock_fenced_with`](crate::Client::write_lock_fenced_with)).
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::Acquire;
///
/// let opts = Acquire::new().timeout(Duration::from_millis(250)).retries(3);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Acquire {
    pub(crate) timeout: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) retries: Option<u32>,
    pub(crate) cancel: Option<Cancel>,
}

impl Acquire {
    /// The client's settings, no cancel handle.
    pub const fn new() -> Acquire {
        Acquire {
            timeout: None,
            deadline: None,
            retries: None,
            cancel: None,
        }
    }

    /// The longest this call waits in all, from its first attempt: no attempt starts after it
    /// (in place of the client's [wait timeout](crate::ClientBuilder::wait_timeout)). Zero
    /// makes one attempt. At most a day.
    pub fn timeout(mut self, timeout: Duration) -> Acquire {
        self.timeout = Some(timeout);
        self
    }

    /// No attempt starts at or after `deadline`. With a [`timeout`](Self::timeout) as well,
    /// the earlier of the two ends the wait. A deadline already past leaves one attempt, as a
    /// zero timeout does.
    pub fn deadline(mut self, deadline: Instant) -> Acquire {
        self.deadline = Some(deadline);
        self
    }

    /// How many retries may come after a retry delay in which no release was announced (in
    /// place of the client's [retry count](crate::ClientBuilder::retry_count)); `u32::MAX`
    /// means no limit.
    pub fn retries(mut self, count: u32) -> Acquire {
        self.retries = Some(count);
        self
    }

    /// Cancelling `cancel` ends this call with [`Error::Cancelled`](crate::Error::Cancelled),
    /// at once, from any thread (see [`Cancel`]).
    pub fn cancel(mut self, cancel: &Cancel) -> Acquire {
        self.cancel = Some(cancel.clone());
        self
    }

    /// Refuses a timeout longer than a day.
    pub(crate) fn check(&self) -> Result<(), InvalidArgument> {
        match self.timeout {
            Some(t) if t > MAX_TIMEOUT => Err(InvalidArgument::BadOption {
                name: "timeout",
                reason: "must be at most a day",
            }),
            _ => Ok(()),
        }
    }
}

/// A handle that cancels waiting acquisitions, from any thread.
///
/// Give it to one or more calls with [`Acquire::cancel`]; [`cancel`](Cancel::cancel) makes
/// every one of them that has not got its lock yet return
/// [`Error::Cancelled`](crate::Error::Cancelled) at once, wherever it is: before its first
/// attempt, with an attempt in flight, parked waiting for a release or a retry, or in a fair
/// queue. The thread blocked in the call is woken: it does not wait for its next retry. What
/// the call had on the nodes is undone on every node: the attempt in flight is released
/// behind itself (on each connection, after the attempt), its place in a fair queue is left,
/// a writer's intent is withdrawn. A call that has already won keeps its lock.
///
/// A handle stays cancelled: calls given it afterwards return `Cancelled` without sending
/// anything. Clones share the state; it is cheap to clone.
///
/// A child after `fork()` has a copy of the handle: it cancels, and wakes, only the calls of
/// the process that calls [`cancel`](Cancel::cancel), and never waits on a thread of its
/// parent that was registering a call with it at the fork.
#[derive(Clone, Default)]
pub struct Cancel {
    inner: Arc<Inner>,
}

struct Inner {
    cancelled: AtomicBool,
    /// Who to wake when cancelled: the operations running with this handle, in each process
    /// that uses it. A child after `fork()` has none of its parent's threads, which may have
    /// held the list at the fork: it never waits on their list, nor wakes their pollers.
    wakers: PerProcess<Mutex<Vec<Registered>>>,
    next_id: AtomicU64,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner {
            cancelled: AtomicBool::new(false),
            wakers: PerProcess::new(Mutex::default()),
            next_id: AtomicU64::new(0),
        }
    }
}

impl Inner {
    /// The operations of this process that wait with the handle.
    fn wakers(&self) -> MutexGuard<'_, Vec<Registered>> {
        let Ok(wakers) = self.wakers.here(|_| Ok::<_, Infallible>(Mutex::default()));
        wakers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One operation waiting with a handle: the poll its thread may be blocked in (as the leader of
/// its client's driver), and the thread itself (parked, as a follower).
struct Registered {
    id: u64,
    waker: Option<Arc<Waker>>,
    thread: Thread,
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels every call waiting with this handle, now and later. Returns at once.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let wakers = self.inner.wakers();
        for w in wakers.iter() {
            // A poller that cannot be woken still sees the flag at its next deadline.
            if let Some(waker) = &w.waker {
                let _ = waker.wake();
            }
            w.thread.unpark();
        }
    }

    /// Whether [`cancel`](Cancel::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }
}

impl Cancellable for Cancel {
    fn is_cancelled(&self) -> bool {
        Cancel::is_cancelled(self)
    }

    fn register(&self, waker: Option<Arc<Waker>>, thread: Thread) -> u64 {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.wakers().push(Registered { id, waker, thread });
        id
    }

    fn unregister(&self, id: u64) {
        let mut wakers = self.inner.wakers();
        if let Some(i) = wakers.iter().position(|w| w.id == id) {
            wakers.swap_remove(i);
        }
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
