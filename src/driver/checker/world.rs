//! The checker's threads and clock: parking, unparking and timed waits on a virtual clock that
//! moves only when every thread of the run waits (see the [checker](super)'s documentation).

use std::cell::RefCell;
use std::collections::HashSet;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shuttle::rand::RngCore;
use shuttle::sync::{Condvar, Mutex, MutexGuard};
use shuttle::thread::ThreadId;

use super::net::Net;

/// How many times the clock may move in one run: a loop that waits a little, again and again,
/// without getting anywhere, is a busy loop in virtual time.
const MAX_ADVANCES: u64 = 20_000;

/// How far the clock may move while a thread still runs (see `World::meanwhile`).
const MEANWHILE: Duration = Duration::from_millis(100);

thread_local! {
    /// The world of the run under way (shuttle runs a test's threads on one system thread).
    static WORLD: RefCell<Option<Arc<World>>> = const { RefCell::new(None) };
}

/// One run's threads, clock and network.
pub(crate) struct World {
    state: Mutex<State>,
    /// Says which threads the driver marks as awake (see `checker::watch`).
    watcher: Mutex<Option<Watcher>>,
    changed: Condvar,
    base: Instant,
}

type Watcher = Box<dyn Fn() -> Vec<Thread> + Send + Sync>;

/// What a thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Parked, until unparked (or its timeout).
    Park,
    /// A caller parked while another caller leads.
    Follower,
    /// In the poller, until a connection has something or the waker is woken.
    Poll,
    /// Sleeping out a timeout.
    Sleep,
    /// Joining a thread, until it ends.
    Join(ThreadId),
}

struct Waiter {
    id: u64,
    thread: ThreadId,
    kind: Kind,
    deadline: Option<Duration>,
    released: bool,
}

pub(crate) struct State {
    /// Virtual time since the run started.
    pub now: Duration,
    /// Threads that exist and have not ended (the test's own included).
    live: usize,
    waiters: Vec<Waiter>,
    next_waiter: u64,
    /// Threads unparked while not parked: their next park returns at once.
    tokens: HashSet<ThreadId>,
    /// Threads of the run that ended.
    ended: HashSet<ThreadId>,
    /// How many times the clock moved.
    pub advances: u64,
    /// A failure found while a thread let time pass, raised by it once it let go of the lock.
    failure: Option<String>,
    /// Which run of the test this is (counted from 1), for the failures' messages.
    run: usize,
    pub net: Net,
}

impl World {
    /// A world around `net`, made the current one for run number `run`.
    pub fn install(net: Net, run: usize) -> Arc<World> {
        let world = Arc::new(World {
            state: Mutex::new(State {
                now: Duration::ZERO,
                live: 1,
                waiters: Vec::new(),
                next_waiter: 0,
                tokens: HashSet::new(),
                ended: HashSet::new(),
                advances: 0,
                failure: None,
                run,
                net,
            }),
            watcher: Mutex::new(None),
            changed: Condvar::new(),
            base: Instant::now(),
        });
        WORLD.with(|w| *w.borrow_mut() = Some(world.clone()));
        world
    }

    /// The world of the run under way.
    pub fn get() -> Arc<World> {
        WORLD
            .with(|w| w.borrow().clone())
            .expect("no checker world installed")
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The virtual instant of `at`.
    pub fn instant(&self, at: Duration) -> Instant {
        self.base + at
    }

    /// Something changed that waiters may wait for: those it satisfies are released.
    pub fn wake(&self, s: &mut State) {
        s.release_satisfied();
        self.changed.notify_all();
    }

    /// Waits as `kind` until what it waits for comes, or `timeout` passes on the clock.
    pub fn wait(&self, kind: Kind, timeout: Option<Duration>) {
        let me = shuttle::thread::current().id();
        let mut s = self.lock();
        if s.satisfied(kind, me) {
            s.consume(kind, me);
            return;
        }
        if timeout == Some(Duration::ZERO) {
            return;
        }
        let id = s.next_waiter;
        s.next_waiter += 1;
        let deadline = timeout.map(|t| s.now + t);
        s.waiters.push(Waiter {
            id,
            thread: me,
            kind,
            deadline,
            released: false,
        });
        self.meanwhile(&mut s);
        if let Some(failure) = self.settle(&mut s).or_else(|| s.failure.take()) {
            drop(s);
            panic!("{failure}");
        }
        if std::env::var_os("REDLOCK_CHECKER_TRACE").is_some() {
            let waiting = s.waiters.iter().filter(|w| !w.released).count();
            eprintln!(
                "{me:?} waits {kind:?} until {deadline:?} at {:?}: live {} waiting {waiting}",
                s.now, s.live
            );
        }
        loop {
            let at = s.waiters.iter().position(|w| w.id == id).expect("own wait");
            if s.waiters[at].released {
                s.waiters.swap_remove(at);
                break;
            }
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.consume(kind, me);
    }

    /// If every thread waits, the clock moves to the first deadline (and what was due then
    /// happens); if none has a deadline, nothing can ever move: a deadlock.
    ///
    /// A failure is returned, to be raised once the world's lock is let go (shuttle does not
    /// let go of a lock while a thread unwinds).
    #[must_use]
    fn settle(&self, s: &mut State) -> Option<String> {
        let waiting = s.waiters.iter().filter(|w| !w.released).count();
        if s.live == 0 || waiting < s.live {
            return None;
        }
        let followers = s.waiting(Kind::Follower);
        if followers > 0 && s.waiting(Kind::Poll) == 0 {
            return Some(format!(
                "run {}: {followers} caller(s) parked as followers while nobody leads (no thread \
                 polls) at {:?}",
                s.run, s.now
            ));
        }
        let awake = self
            .watcher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|w| w())
            .unwrap_or_default();
        for t in awake {
            let lost = s
                .waiters
                .iter()
                .any(|w| !w.released && w.kind == Kind::Follower && w.thread == t.id);
            if lost {
                return Some(format!(
                    "run {}: lost wake-up: caller thread {:?} is parked as a follower, but was \
                     posted to (marked as not parked), and no thread is left to unpark it (at {:?})",
                    s.run, t.id, s.now
                ));
            }
        }
        let Some(next) = s.next_event() else {
            let kinds: Vec<Kind> = s.waiters.iter().map(|w| w.kind).collect();
            return Some(format!(
                "run {}: deadlock: every thread waits, none until a deadline: {kinds:?}",
                s.run
            ));
        };
        self.advance(s, next)
    }

    /// Time passes while some threads still run: the clock moves to the first deadline, if
    /// that is near enough for a thread still at work to take that long. Chosen at random (by
    /// the checker, so that a schedule replays), at a quarter of the waits.
    fn meanwhile(&self, s: &mut State) {
        if shuttle::rand::thread_rng().next_u32() % 4 != 0 {
            return;
        }
        if let Some(next) = s.next_event().filter(|&t| t <= s.now + MEANWHILE) {
            if let Some(failure) = self.advance(s, next) {
                s.failure.get_or_insert(failure);
            }
        }
    }

    /// The clock moves to `next`: what is due then happens.
    #[must_use]
    fn advance(&self, s: &mut State, next: Duration) -> Option<String> {
        s.advances += 1;
        if s.advances > MAX_ADVANCES {
            return Some(format!(
                "run {}: busy loop: the clock moved {MAX_ADVANCES} times (now {:?})",
                s.run, s.now
            ));
        }
        s.now = s.now.max(next);
        let now = s.now;
        s.net.deliver(now);
        for w in &mut s.waiters {
            if w.deadline.is_some_and(|d| d <= now) {
                w.released = true;
            }
        }
        self.wake(s);
        None
    }

    /// Has `watcher` say, whenever every thread waits, which threads the driver marks as awake.
    pub fn watch(&self, watcher: Watcher) {
        *self
            .watcher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(watcher);
    }

    /// A thread of the run starts.
    pub fn enter(&self) {
        self.lock().live += 1;
    }

    /// A thread of the run ends: those that join it go on.
    pub fn leave(&self) {
        let mut s = self.lock();
        s.live -= 1;
        s.ended.insert(shuttle::thread::current().id());
        s.release_satisfied();
        let failure = self.settle(&mut s);
        self.changed.notify_all();
        drop(s);
        if let Some(failure) = failure {
            panic!("{failure}");
        }
    }

    pub fn unpark(&self, thread: ThreadId) {
        let mut s = self.lock();
        s.tokens.insert(thread);
        self.wake(&mut s);
    }
}

impl State {
    /// The first deadline of a waiting thread, or reply of a slow node.
    fn next_event(&self) -> Option<Duration> {
        self.waiters
            .iter()
            .filter(|w| !w.released)
            .filter_map(|w| w.deadline)
            .chain(self.net.next_delivery())
            .min()
    }

    fn waiting(&self, kind: Kind) -> usize {
        self.waiters
            .iter()
            .filter(|w| !w.released && w.kind == kind)
            .count()
    }

    fn satisfied(&self, kind: Kind, thread: ThreadId) -> bool {
        match kind {
            Kind::Park | Kind::Follower => self.tokens.contains(&thread),
            Kind::Poll => self.net.has_events(),
            Kind::Sleep => false,
            Kind::Join(t) => self.ended.contains(&t),
        }
    }

    fn consume(&mut self, kind: Kind, thread: ThreadId) {
        if matches!(kind, Kind::Park | Kind::Follower) {
            self.tokens.remove(&thread);
        }
    }

    fn release_satisfied(&mut self) {
        for i in 0..self.waiters.len() {
            let (kind, thread) = (self.waiters[i].kind, self.waiters[i].thread);
            if !self.waiters[i].released && self.satisfied(kind, thread) {
                self.waiters[i].released = true;
            }
        }
    }
}

/// A thread's handle, to unpark it.
#[derive(Clone, Debug)]
pub(crate) struct Thread {
    id: ThreadId,
}

impl Thread {
    pub fn unpark(&self) {
        World::get().unpark(self.id);
    }
}

pub(crate) fn current() -> Thread {
    Thread {
        id: shuttle::thread::current().id(),
    }
}

pub(crate) fn now() -> Instant {
    let world = World::get();
    let now = world.lock().now;
    world.instant(now)
}

pub(crate) fn park_timeout(timeout: Duration) {
    World::get().wait(Kind::Park, Some(timeout));
}

pub(crate) fn park_follower(timeout: Duration) {
    World::get().wait(Kind::Follower, Some(timeout));
}

pub(crate) fn sleep(timeout: Duration) {
    World::get().wait(Kind::Sleep, Some(timeout));
}

/// Starts a thread of the run: it counts as one until it ends.
pub(crate) fn spawn(_name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    spawn_joinable(f);
    Ok(())
}

/// Like [`spawn`], with a handle to join it by (see [`join`]).
pub(crate) fn spawn_joinable<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> shuttle::thread::JoinHandle<T> {
    let world = World::get();
    world.enter();
    shuttle::thread::spawn(move || {
        struct Leave(Arc<World>);
        impl Drop for Leave {
            fn drop(&mut self) {
                // A thread that panics fails the run: nothing more to count.
                if !std::thread::panicking() {
                    self.0.leave();
                }
            }
        }
        let _leave = Leave(world);
        f()
    })
}

/// Waits until the thread of `handle` ended.
pub(crate) fn wait_ended(thread: ThreadId) {
    World::get().wait(Kind::Join(thread), None);
}

/// Joins `handle` (see [`wait_ended`]).
pub(crate) fn join<T>(handle: shuttle::thread::JoinHandle<T>) -> T {
    wait_ended(handle.thread().id());
    match handle.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}
