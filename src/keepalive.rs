//! Auto-extension: one background thread per [`Client`] keeps its guards alive.
//!
//! [`Guard::keep_alive`], on a guard of any kind, checks the [`KeepAlive`] settings against the client, hands the guard to the client's keeper and
//! returns a [`KeptLock`]. Settings that cannot keep the lock are refused, and the guard is
//! given back untouched in the [`KeepAliveError`].
//!
//! The keeper extends each kept lock to its TTL every interval (a third of the TTL unless
//! set), and sooner whenever the validity left would otherwise fall below a safety margin, so
//! a lock with little validity left is extended at once. One thread, started on first use,
//! serves every kept guard of the client. When an extension is refused by the quorum, or the
//! validity runs out before one succeeds, the lock is lost: [`KeptLock::is_lost`] turns true
//! and the holder is told by a channel or a callback given in [`KeepAlive`]. A failure that may
//! pass (a node unreachable) is retried every [`KeepAlive::retry`] while the validity lasts.
//! A callback that panics is contained and reported through the panic hook; the keeper goes on.
//!
//! [`KeptLock::is_lost`] and [`KeptLock::validity`] read the lock's end of validity, which the
//! keeper updates around every extension round, without waiting for the keeper: they are true
//! at every instant, also while the keeper is busy with other guards' rounds.
//!
//! The keeper thread holds no [`Client`] of its own, only weak references to the guards it
//! serves, so dropping every client and guard ends it.
//!
//! The keeper thread is per process: a child after `fork()` starts one of its own for the locks
//! it takes itself, and never touches the locks its parent took (see [`Error::OtherProcess`]).
#![forbid(unsafe_code)]

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::engine::keepalive::{KeptValidity, Schedule};
use crate::error::{Error, InvalidArgument};
use crate::guard::kind::Kind;
use crate::guard::{Guard, Held};
use crate::keeper::{Job, Keeper};

/// Delay before retrying an extension that failed for a reason that may pass.
const DEFAULT_RETRY: Duration = Duration::from_millis(100);

/// Settings of one kept-alive guard: the TTL each extension sets, how often, and whom to tell
/// when the lock is lost.
///
/// # When extensions happen
///
/// Each extension resets the lock to the TTL, which gives it a validity of the TTL less the
/// client's drift allowance. The next extension is due one interval later, or earlier if the
/// validity left would by then fall below a safety margin: twice the client's node timeout
/// plus one retry delay (time for a round that times out and a retry), but at least a third
/// and at most two thirds of the validity an extension gives. So a lock taken with a shorter
/// TTL than the one it is kept with is extended at once, and a failed extension still leaves
/// time for retries.
///
/// [`Guard::keep_alive`] refuses, with [`InvalidArgument`] in a [`KeepAliveError`], a TTL the
/// client would refuse (zero, too long, not above the drift allowance) and an interval that is
/// zero or not shorter than the validity an extension gives.
pub struct KeepAlive {
    ttl: Duration,
    interval: Option<Duration>,
    retry: Duration,
    notify: Option<Notify>,
}

enum Notify {
    Channel(mpsc::Sender<Lost>),
    Callback(Box<dyn FnOnce(Lost) + Send>),
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive")
            .field("ttl", &self.ttl)
            .field("interval", &self.period())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl KeepAlive {
    /// Extend the lock to `ttl` every `ttl / 3` (sooner if the validity left runs low), retry
    /// failed extensions every 100 ms, and tell no one but [`KeptLock::is_lost`] when the lock
    /// is lost.
    pub fn new(ttl: Duration) -> KeepAlive {
        KeepAlive {
            ttl,
            interval: None,
            retry: DEFAULT_RETRY,
            notify: None,
        }
    }

    /// Extends every `interval` instead of every `ttl / 3`, and sooner if the validity left
    /// runs low (see [When extensions happen](KeepAlive#when-extensions-happen)). It must be
    /// more than zero and less than the validity an extension gives (`ttl` less the drift
    /// allowance), or `keep_alive` refuses it.
    pub fn interval(mut self, interval: Duration) -> KeepAlive {
        self.interval = Some(interval);
        self
    }

    /// How soon an extension that failed for a reason that may pass (nodes unreachable) is
    /// tried again, while the validity lasts. Default 100 ms; at least 1 ms.
    pub fn retry(mut self, retry: Duration) -> KeepAlive {
        self.retry = retry;
        self
    }

    /// Sends a [`Lost`] on `sender` when the lock is lost (once, from the keeper thread).
    pub fn notify(mut self, sender: mpsc::Sender<Lost>) -> KeepAlive {
        self.notify = Some(Notify::Channel(sender));
        self
    }

    /// Calls `callback` on the keeper thread when the lock is lost (once). Keep it short: the
    /// keeper serves every guard of the client on that thread.
    ///
    /// A panic in `callback` is contained: it is reported through the panic hook like any
    /// other (by default, a message on stderr naming the `redlock-mux-keeper` thread), and the
    /// keeper goes on serving the client's other kept locks. (In a program built with
    /// `panic = "abort"`, a panic ends the process, as it does anywhere.)
    pub fn on_lost(mut self, callback: impl FnOnce(Lost) + Send + 'static) -> KeepAlive {
        self.notify = Some(Notify::Callback(Box::new(callback)));
        self
    }

    fn period(&self) -> Duration {
        self.interval.unwrap_or(self.ttl / 3)
    }

    /// These settings checked against `client`: what the keeper works with.
    fn plan(&self, client: &Client) -> Result<Schedule, InvalidArgument> {
        let (_, timing) = client.timing(self.ttl)?;
        Schedule::new(
            timing,
            self.interval,
            self.retry,
            client.config().node_timeout,
        )
    }
}

/// The notice that a kept-alive lock was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The lock's resource key (for an all-or-none set, its first key in sorted order).
    pub key: Vec<u8>,
    /// Why: [`Error::Contended`] when the quorum refused the extension (the key expired or
    /// holds someone else's token), [`Error::ValidityExpired`] when no extension won in time.
    pub error: Error,
}

/// Why [`Guard::keep_alive`] refused its settings, with the guard given back as it was: still held, and not kept
/// alive. The error is [`Error::InvalidArgument`], or [`Error::OtherProcess`] for a guard a
/// child inherited through `fork()`.
///
/// It converts into [`Error`], so `?` works in functions that return `Result<_, Error>`; the
/// guard is then dropped, which releases it. To keep the guard, take it back with
/// [`into_inner`](KeepAliveError::into_inner) or the [`guard`](KeepAliveError::guard) field.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::{Client, KeepAlive};
///
/// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
/// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
/// let client = Client::new(nodes.split(','))?;
/// let ttl = Duration::from_secs(3);
/// let lock = client.lock("report", ttl)?;
/// // An interval longer than the TTL cannot keep the lock: refused, and the lock comes back.
/// let lock = match lock.keep_alive(KeepAlive::new(ttl).interval(ttl * 2)) {
///     Ok(kept) => return Ok(kept.release()?),
///     Err(refused) => refused.into_inner(),
/// };
/// let kept = lock.keep_alive(KeepAlive::new(ttl))?;
/// kept.release()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Debug)]
pub struct KeepAliveError<G> {
    /// The guard, held as before the call.
    pub guard: G,
    /// Why the settings were refused.
    pub error: Error,
}

impl<G> KeepAliveError<G> {
    /// The guard, held as before the call.
    pub fn into_inner(self) -> G {
        self.guard
    }
}

impl<G> fmt::Display for KeepAliveError<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "keep-alive refused: {}", self.error)
    }
}

impl<G: fmt::Debug> std::error::Error for KeepAliveError<G> {}

impl<G> From<KeepAliveError<G>> for Error {
    /// The error; the guard is dropped, which releases it.
    fn from(refused: KeepAliveError<G>) -> Error {
        refused.error
    }
}

/// Hands `held` to its client's keeper thread, with settings already checked.
fn keep_alive(held: Held, plan: Schedule, settings: KeepAlive) -> KeptLock {
    let keeper = held.client().keeper().get_or_init(Keeper::start).clone();
    let key = held.key().to_vec();
    let token = held.token().to_vec();
    let fencing_token = held.fencing_token();
    let holder = held.holder();
    let now = Instant::now();
    let validity = KeptValidity::new(plan, now, held.valid_until());
    let shared = Arc::new(Shared {
        lock: Mutex::new(Some(held)),
        validity,
        notify: Mutex::new(settings.notify),
    });
    let job = Box::new(Kept(Arc::downgrade(&shared)));
    if keeper.add(shared.validity.next_due(now), job).is_err() {
        // The thread can only be gone if it panicked; without it nobody extends the lock.
        shared.validity.set_lost();
    }
    KeptLock {
        shared,
        key,
        token,
        fencing_token,
        holder,
    }
}

/// State shared by a [`KeptLock`] and the keeper thread.
struct Shared {
    /// The lock; `None` once released by its holder.
    lock: Mutex<Option<Held>>,
    /// The lock's end of validity, and whether it is lost: readable without waiting for an
    /// extension round in flight.
    validity: KeptValidity,
    /// Whom to tell of a loss; taken when telling.
    notify: Mutex<Option<Notify>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Option<Held>> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The validity left at `now`, or `None` once the lock is lost.
    fn left(&self, now: Instant) -> Option<Duration> {
        self.validity.left(now)
    }

    /// Extends `guard` once; returns when to come back, or why the lock is lost.
    fn extend(&self, guard: &mut Held) -> Result<Instant, Error> {
        self.validity.round_starts(Instant::now())?;
        let result = guard.extend(self.validity.plan().ttl());
        self.validity
            .round_ended(result, guard.valid_until(), Instant::now())
    }
}

/// A lock kept alive by its client's keeper thread. Dropping it stops the extensions and
/// releases the lock, best effort; [`release`](KeptLock::release) reports the outcome.
///
/// `KeptLock` is `Send` and `Sync`: the holder may check [`is_lost`](KeptLock::is_lost) and
/// [`validity`](KeptLock::validity) from any thread while the keeper extends the lock; neither
/// waits for the keeper. [`release`](KeptLock::release) waits while an extension round is in
/// flight, at most the client's node timeout.
#[derive(Debug)]
pub struct KeptLock {
    shared: Arc<Shared>,
    key: Vec<u8>,
    token: Vec<u8>,
    fencing_token: Option<u64>,
    /// The process that took the lock, whose keeper thread extends it.
    holder: u32,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

impl KeptLock {
    /// The resource key this lock is on (for an all-or-none set, its first key in sorted
    /// order).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// This holder's token (see [`Guard::token`]).
    pub fn token(&self) -> &[u8] {
        &self.token
    }

    /// The fencing token, if the lock kept alive is a fenced one (see
    /// [`Guard::fencing_token`]). Extensions keep it.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Whether the lock was lost: an extension was refused by the quorum, or the validity ran
    /// out before one won. True from the instant the validity ends, whether or not the keeper
    /// thread has run since. Once lost, always lost; stop work that needs the lock.
    pub fn is_lost(&self) -> bool {
        self.shared.left(Instant::now()).is_none()
    }

    /// The time left before the lock may be granted to someone else, as of now: until the end
    /// of validity the last extension round left (or, while a round is in flight, the earlier
    /// end it may leave). Zero once lost or run out.
    pub fn validity(&self) -> Duration {
        self.shared.left(Instant::now()).unwrap_or(Duration::ZERO)
    }

    /// Stops the extensions and releases the lock on every node (see [`Guard::release`]). A
    /// lost lock is released too, in case some
    /// node still holds our token.
    ///
    /// In a child after `fork()`, the lock is its parent's: this fails with
    /// [`Error::OtherProcess`], and nothing is sent.
    pub fn release(self) -> Result<(), Error> {
        if self.holder != std::process::id() {
            return Err(Error::OtherProcess {
                holder: self.holder,
            });
        }
        let lock = self.shared.lock().take();
        match lock {
            Some(mut lock) => lock.release(),
            None => Ok(()),
        }
    }
}

impl Drop for KeptLock {
    fn drop(&mut self) {
        if self.holder != std::process::id() {
            // A child's copy of its parent's kept lock: the parent's keeper thread, which does
            // not exist here, may have been extending it at the fork, with its mutex held. It
            // is left as it is, never waited on, never dropped.
            std::mem::forget(Arc::clone(&self.shared));
            return;
        }
        // Dropping the guard releases it; the keeper finds `None` and forgets the entry.
        let lock = self.shared.lock().take();
        drop(lock);
    }
}

impl<K: Kind> Guard<K> {
    /// Hands this guard to the client's keeper thread, which extends it in the background
    /// until the returned [`KeptLock`] is released or dropped, or the lock is lost; see
    /// [`KeepAlive`] for when extensions happen.
    ///
    /// Settings that cannot keep the lock (see [`KeepAlive`]) are refused with a
    /// [`KeepAliveError`] that gives this guard back, still held; `?` turns it into an
    /// [`Error`] and releases the guard. In a child after `fork()`, a guard its parent took is
    /// refused with [`Error::OtherProcess`]: the parent's keeper extends the parent's locks,
    /// and the child's keeper (a thread of its own, started on first use there) only those the
    /// child took itself.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    /// use redlock_mux::{Client, KeepAlive};
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let ttl = Duration::from_secs(3);
    /// let (tx, lost) = mpsc::channel();
    /// let kept = client.lock("report", ttl)?.keep_alive(KeepAlive::new(ttl).notify(tx))?;
    /// for _chunk in 0..100 {
    ///     if kept.is_lost() || lost.try_recv().is_ok() {
    ///         break; // someone else may hold it now
    ///     }
    ///     // ... work on a chunk ...
    /// }
    /// kept.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    // The guard comes back by value in the error, as `Arc::try_unwrap` gives back the Arc;
    // boxing it would only make the rare refusal awkward to use.
    #[allow(clippy::result_large_err)]
    pub fn keep_alive(self, settings: KeepAlive) -> Result<KeptLock, KeepAliveError<Self>> {
        if let Err(error) = self.held().check_holder() {
            return Err(KeepAliveError { guard: self, error });
        }
        match settings.plan(self.client()) {
            Ok(plan) => Ok(keep_alive(self.into_held(), plan, settings)),
            Err(e) => Err(KeepAliveError {
                guard: self,
                error: e.into(),
            }),
        }
    }
}

impl Client {
    /// Takes the lock on `key` for `ttl` (waiting like [`Client::lock`]), runs `work` while
    /// the lock is extended in the background every `ttl / 3` (see [`KeepAlive::new`]), then
    /// releases it. A `ttl` that cannot be kept alive is refused before the lock is taken.
    ///
    /// `work` should check [`KeptLock::is_lost`] before any step that needs the lock. A
    /// failed release is not reported: the work is done, and the lock expires by itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let done = client.with_lock("nightly-job", Duration::from_secs(5), |guard| {
    ///     // ... long work, checking guard.is_lost() between steps ...
    ///     !guard.is_lost()
    /// })?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn with_lock<R>(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        work: impl FnOnce(&KeptLock) -> R,
    ) -> Result<R, Error> {
        let settings = KeepAlive::new(ttl);
        // Refused before the lock is taken, not after.
        settings.plan(self)?;
        let kept = self.lock(key, ttl)?.keep_alive(settings)?;
        let r = work(&kept);
        let _ = kept.release();
        Ok(r)
    }
}

/// A kept lock, as the keeper thread's job.
struct Kept(Weak<Shared>);

impl Job for Kept {
    fn run(&mut self) -> Option<Instant> {
        self.0.upgrade().and_then(|shared| serve(&shared))
    }

    fn wanted(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Extends one guard; returns when to come back, or `None` to forget it.
fn serve(shared: &Shared) -> Option<Instant> {
    let mut slot = shared.lock();
    let guard = slot.as_mut()?;
    let error = match shared.extend(guard) {
        Ok(due) => return Some(due),
        Err(e) => e,
    };
    let key = guard.key().to_vec();
    drop(slot);
    shared.validity.set_lost();
    let notify = shared
        .notify
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let notice = Lost { key, error };
    match notify {
        Some(Notify::Channel(tx)) => {
            let _ = tx.send(notice);
        }
        Some(Notify::Callback(f)) => {
            // Every other kept lock of the client depends on this thread: a panicking callback
            // must not end it. The panic hook has reported the panic by the time this returns.
            let _ = panic::catch_unwind(AssertUnwindSafe(move || f(notice)));
        }
        None => {}
    }
    None
}
