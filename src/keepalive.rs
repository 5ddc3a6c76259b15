//! Auto-extension: one background thread per [`Client`] keeps its guards alive.
//!
//! [`Lock::keep_alive`] (and [`ReadLock::keep_alive`], [`WriteLock::keep_alive`]) hands a
//! guard to the client's keeper and returns a [`KeptLock`]. The keeper extends the lock to its
//! TTL every interval (a third of the TTL unless set), for every kept guard of the client, on one thread started on first use. When an extension is
//! refused by the quorum, or the validity runs out before one succeeds, the guard is marked
//! lost: [`KeptLock::is_lost`] turns true and the holder is told at once by a channel or a
//! callback given in [`KeepAlive`]. A failure that may pass (a node unreachable) is retried
//! every [`KeepAlive::retry`] while the validity lasts.
//!
//! The keeper thread holds no [`Client`] of its own, only weak references to the guards it
//! serves, so dropping every client and guard ends it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::client::{Client, Lock};
use crate::error::Error;
use crate::rwlock::{ReadLock, WriteLock};

/// Delay before retrying an extension that failed for a reason that may pass.
const DEFAULT_RETRY: Duration = Duration::from_millis(100);

/// Settings of one kept-alive guard: the TTL each extension sets, how often, and whom to tell
/// when the lock is lost.
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

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("ttl", &self.ttl)
            .field("interval", &self.period())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl KeepAlive {
    /// Extend the lock to `ttl` every `ttl / 3`, retry failed extensions every 100 ms, and tell
    /// no one but [`KeptLock::is_lost`] when the lock is lost.
    pub fn new(ttl: Duration) -> KeepAlive {
        KeepAlive {
            ttl,
            interval: None,
            retry: DEFAULT_RETRY,
            notify: None,
        }
    }

    /// Extends every `interval` instead of every `ttl / 3`. It should be well under the TTL:
    /// an extension must win before the validity runs out.
    pub fn interval(mut self, interval: Duration) -> KeepAlive {
        self.interval = Some(interval);
        self
    }

    /// How soon an extension that failed for a reason that may pass (nodes unreachable) is
    /// tried again, while the validity lasts. Default 100 ms.
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
    pub fn on_lost(mut self, callback: impl FnOnce(Lost) + Send + 'static) -> KeepAlive {
        self.notify = Some(Notify::Callback(Box::new(callback)));
        self
    }

    fn period(&self) -> Duration {
        // Never longer than the TTL (the lock would lapse first) nor than any TTL the client
        // accepts, so the keeper's clock arithmetic cannot overflow.
        self.interval
            .unwrap_or(self.ttl / 3)
            .min(self.ttl)
            .min(crate::MAX_TTL)
            .max(Duration::from_millis(1))
    }
}

/// The notice that a kept-alive lock was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The lock's key.
    pub key: Vec<u8>,
    /// Why: [`Error::Contended`] when the quorum refused the extension (the key expired or
    /// holds someone else's token), [`Error::ValidityExpired`] when no extension won in time.
    pub error: Error,
}

/// The guards the keeper can extend: a mutex, or either side of a read-write lock.
#[derive(Debug)]
enum Guard {
    Mutex(Lock),
    Read(ReadLock),
    Write(WriteLock),
}

impl Guard {
    fn key(&self) -> &[u8] {
        match self {
            Guard::Mutex(l) => l.key(),
            Guard::Read(l) => l.key(),
            Guard::Write(l) => l.key(),
        }
    }

    fn token(&self) -> &[u8] {
        match self {
            Guard::Mutex(l) => l.token(),
            Guard::Read(l) => l.token(),
            Guard::Write(l) => l.token(),
        }
    }

    fn validity(&self) -> Duration {
        match self {
            Guard::Mutex(l) => l.validity(),
            Guard::Read(l) => l.validity(),
            Guard::Write(l) => l.validity(),
        }
    }

    fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self {
            Guard::Mutex(l) => l.extend(ttl),
            Guard::Read(l) => l.extend(ttl),
            Guard::Write(l) => l.extend(ttl),
        }
    }

    fn release(self) -> Result<(), Error> {
        match self {
            Guard::Mutex(l) => l.release(),
            Guard::Read(l) => l.release(),
            Guard::Write(l) => l.release(),
        }
    }

    /// Hands the guard to `client`'s keeper thread; see [`Lock::keep_alive`].
    fn keep_alive(self, client: &Client, settings: KeepAlive) -> KeptLock {
        let keeper = client.keeper().get_or_init(Keeper::start).clone();
        let key = self.key().to_vec();
        let token = self.token().to_vec();
        let interval = settings.period();
        let shared = Arc::new(Shared {
            lock: Mutex::new(Some(self)),
            lost: AtomicBool::new(false),
            settings: Mutex::new(settings),
        });
        let entry = Entry {
            due: Instant::now() + interval,
            shared: Arc::downgrade(&shared),
        };
        if keeper.send(entry).is_err() {
            // The thread can only be gone if it panicked; without it nobody extends the lock.
            shared.lost.store(true, Ordering::Release);
        }
        KeptLock { shared, key, token }
    }
}

/// State shared by a [`KeptLock`] and the keeper thread.
struct Shared {
    /// The guard; `None` once released by its holder.
    lock: Mutex<Option<Guard>>,
    lost: AtomicBool,
    settings: Mutex<KeepAlive>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Option<Guard>> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A lock kept alive by its client's keeper thread. Dropping it stops the extensions and
/// releases the lock, best effort; [`release`](KeptLock::release) reports the outcome.
///
/// `KeptLock` is `Send` and `Sync`: the holder may check [`is_lost`](KeptLock::is_lost) from
/// any thread while the keeper extends the lock. Calls that read the guard
/// ([`validity`](KeptLock::validity), [`release`](KeptLock::release)) wait while an extension
/// round is in flight, at most the client's node timeout.
#[derive(Debug)]
pub struct KeptLock {
    shared: Arc<Shared>,
    key: Vec<u8>,
    token: Vec<u8>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("lost", &self.lost.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl KeptLock {
    /// The key this lock is on.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// This holder's token (see [`Lock::token`]).
    pub fn token(&self) -> &[u8] {
        &self.token
    }

    /// Whether the lock was lost: an extension was refused by the quorum, or the validity ran
    /// out before one won. Once lost, always lost; stop work that needs the lock.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::Acquire)
    }

    /// The time left before the lock may be granted to someone else, as of the last extension
    /// that won; zero once lost or run out.
    pub fn validity(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.shared
            .lock()
            .as_ref()
            .map_or(Duration::ZERO, Guard::validity)
    }

    /// Stops the extensions and releases the lock on every node (see [`Lock::release`],
    /// [`ReadLock::release`], [`WriteLock::release`]). A lost lock is released too, in case some
    /// node still holds our token.
    pub fn release(self) -> Result<(), Error> {
        let lock = self.shared.lock().take();
        match lock {
            Some(lock) => lock.release(),
            None => Ok(()),
        }
    }
}

impl Drop for KeptLock {
    fn drop(&mut self) {
        // Dropping the guard releases it; the keeper finds `None` and forgets the entry.
        let lock = self.shared.lock().take();
        drop(lock);
    }
}

impl Lock {
    /// Hands this guard to the client's keeper thread, which extends it in the background
    /// until the returned [`KeptLock`] is released or dropped, or the lock is lost.
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
    /// let kept = client.lock("report", ttl)?.keep_alive(KeepAlive::new(ttl).notify(tx));
    /// for _chunk in 0..100 {
    ///     if kept.is_lost() || lost.try_recv().is_ok() {
    ///         break; // someone else may hold it now
    ///     }
    ///     // ... work on a chunk ...
    /// }
    /// kept.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn keep_alive(self, settings: KeepAlive) -> KeptLock {
        let client = self.client().clone();
        Guard::Mutex(self).keep_alive(&client, settings)
    }
}

impl ReadLock {
    /// Hands this read lock to the client's keeper thread, which extends this reader's hold in
    /// the background, as [`Lock::keep_alive`] does for the mutex.
    pub fn keep_alive(self, settings: KeepAlive) -> KeptLock {
        let client = self.client().clone();
        Guard::Read(self).keep_alive(&client, settings)
    }
}

impl WriteLock {
    /// Hands this write lock to the client's keeper thread, which extends it in the
    /// background, as [`Lock::keep_alive`] does for the mutex.
    pub fn keep_alive(self, settings: KeepAlive) -> KeptLock {
        let client = self.client().clone();
        Guard::Write(self).keep_alive(&client, settings)
    }
}

impl Client {
    /// Takes the lock on `key` for `ttl` (waiting like [`Client::lock`]), runs `work` while
    /// the lock is extended in the background every `ttl / 3`, then releases it.
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
        let kept = self.lock(key, ttl)?.keep_alive(KeepAlive::new(ttl));
        let r = work(&kept);
        let _ = kept.release();
        Ok(r)
    }
}

/// One kept guard in the keeper's schedule.
struct Entry {
    due: Instant,
    shared: Weak<Shared>,
}

/// The handle a client keeps to its keeper thread. Cloned into each `keep_alive` call; the
/// thread ends when every handle is gone and it has no live guard left.
#[derive(Clone)]
pub(crate) struct Keeper {
    tx: mpsc::Sender<Entry>,
}

/// Where a client keeps its keeper, started on first use.
pub(crate) type KeeperSlot = OnceLock<Keeper>;

impl Keeper {
    fn start() -> Keeper {
        let (tx, rx) = mpsc::channel();
        // If no thread can be started, the receiver is dropped with the closure, and every
        // `keep_alive` marks its guard lost at once: nobody would extend it.
        let _ = thread::Builder::new()
            .name("redlock-mux-keeper".into())
            .spawn(move || run(rx));
        Keeper { tx }
    }

    fn send(&self, entry: Entry) -> Result<(), mpsc::SendError<Entry>> {
        self.tx.send(entry)
    }
}

/// The keeper thread: extends each guard when due, soonest first.
fn run(rx: mpsc::Receiver<Entry>) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut open = true;
    loop {
        // Guards released or dropped since: forget them now, so the thread can end at once.
        entries.retain(|e| e.shared.strong_count() > 0);
        let next = entries.iter().map(|e| e.due).min();
        let now = Instant::now();
        if open {
            let received = match next {
                Some(due) if due > now => rx.recv_timeout(due - now),
                Some(_) => Err(RecvTimeoutError::Timeout),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(entry) => {
                    entries.push(entry);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => open = false,
                Err(RecvTimeoutError::Timeout) => {}
            }
        } else {
            match next {
                None => return,
                Some(due) if due > now => thread::sleep(due - now),
                Some(_) => {}
            }
        }
        let now = Instant::now();
        entries.retain_mut(|e| {
            if e.due > now {
                return true;
            }
            let next = e.shared.upgrade().and_then(|shared| serve(&shared));
            if let Some(due) = next {
                e.due = due;
            }
            next.is_some()
        });
    }
}

/// Extends one guard; returns when to come back, or `None` to forget it.
fn serve(shared: &Shared) -> Option<Instant> {
    let mut slot = shared.lock();
    let lock = slot.as_mut()?;
    let settings = shared
        .settings
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let (ttl, interval, retry) = (settings.ttl, settings.period(), settings.retry);
    drop(settings);
    let error = match lock.extend(ttl) {
        Ok(()) => return Some(Instant::now() + interval),
        Err(e) => e,
    };
    let left = lock.validity();
    let lost = match error {
        Error::QuorumUnreachable { .. } | Error::Io(_) if !left.is_zero() => {
            return Some(Instant::now() + retry.min(left).min(crate::MAX_TTL));
        }
        Error::QuorumUnreachable { .. } | Error::Io(_) => Error::ValidityExpired {
            elapsed: Duration::ZERO,
        },
        other => other,
    };
    let key = lock.key().to_vec();
    drop(slot);
    shared.lost.store(true, Ordering::Release);
    let notify = shared
        .settings
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .notify
        .take();
    let notice = Lost { key, error: lost };
    match notify {
        Some(Notify::Channel(tx)) => {
            let _ = tx.send(notice);
        }
        Some(Notify::Callback(f)) => f(notice),
        None => {}
    }
    None
}
