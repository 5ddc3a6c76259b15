//! The keeper thread: one per client, started on first use, that runs jobs when they are due,
//! the most urgent first. Keep-alive (`keepalive`) gives it one job per kept lock.
//!
//! The thread holds no client of its own, only the jobs; it ends once every handle to it is
//! gone and no job is wanted any more.
#![forbid(unsafe_code)]

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::OnceLock;
use std::thread;
use std::time::Instant;

use crate::process::PerProcess;

/// Work the keeper thread does when it is due.
pub(crate) trait Job: Send {
    /// Does the work; returns when it is due again, or `None` when it is done.
    fn run(&mut self) -> Option<Instant>;
    /// Whether anyone still wants the job; one nobody wants is dropped without running.
    fn wanted(&self) -> bool;
}

/// A job and when it is due.
struct Entry {
    due: Instant,
    job: Box<dyn Job>,
}

/// The handle a client keeps to its keeper thread.
#[derive(Clone)]
pub(crate) struct Keeper {
    tx: mpsc::Sender<Entry>,
}

/// Where a client keeps its keeper, started on first use in each process: a child after
/// `fork()` has none of its parent's threads, and starts its own.
pub(crate) type KeeperSlot = PerProcess<OnceLock<Keeper>>;

impl Keeper {
    /// Starts the thread.
    pub fn start() -> Keeper {
        let (tx, rx) = mpsc::channel();
        // If no thread can be started, the receiver is dropped with the closure, and `add`
        // fails: nobody would run the job.
        let _ = thread::Builder::new()
            .name("redlock-mux-keeper".into())
            .spawn(move || run(rx));
        Keeper { tx }
    }

    /// Hands `job` to the thread, to run at `due`. Fails only if the thread is gone.
    pub fn add(&self, due: Instant, job: Box<dyn Job>) -> Result<(), ()> {
        self.tx.send(Entry { due, job }).map_err(|_| ())
    }
}

/// The keeper thread: runs each job when due, soonest first.
fn run(rx: mpsc::Receiver<Entry>) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut open = true;
    loop {
        // Jobs nobody wants any more: forget them now, so the thread can end at once.
        entries.retain(|e| e.job.wanted());
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
        // The most urgent first: a slow job delays every job run after it.
        entries.sort_by_key(|e| e.due);
        let now = Instant::now();
        entries.retain_mut(|e| {
            if e.due > now {
                return true;
            }
            let next = if e.job.wanted() { e.job.run() } else { None };
            if let Some(due) = next {
                e.due = due;
            }
            next.is_some()
        });
    }
}
