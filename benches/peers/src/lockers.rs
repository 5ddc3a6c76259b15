//! Every implementation measured, behind one interface.
//!
//! Each is used the way its documentation shows, with its default retry policy: the point is
//! what a user of that crate gets. Keys are distinct per implementation so none sees another's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::raw::{Raw, Tokens};

/// TTL of every lock taken. Long next to any run, so nothing expires under measurement.
pub const TTL: Duration = Duration::from_secs(10);

/// The implementations, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// This crate.
    Ours,
    /// The hand-written floor in `raw.rs`, reading all N replies.
    Raw,
    /// The same, returning at the quorum (`Raw::at_quorum`): the ideal single caller.
    RawQ,
    /// `rslock` (async, tokio): one multiplexed connection per node, parallel sends.
    Rslock,
    /// `redlock` (sync): nodes one after another, a new connection per command.
    Redlock,
    /// `redsync` (sync): nodes one after another, a new connection per command.
    Redsync,
}

impl Kind {
    /// Every implementation, in table order.
    pub const ALL: [Kind; 6] = [
        Kind::Ours,
        Kind::Raw,
        Kind::RawQ,
        Kind::Rslock,
        Kind::Redlock,
        Kind::Redsync,
    ];

    /// The column name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ours => "redlock-mux",
            Kind::Raw => "raw",
            Kind::RawQ => "rawQ",
            Kind::Rslock => "rslock",
            Kind::Redlock => "redlock",
            Kind::Redsync => "redsync",
        }
    }

    /// Whether this is a published peer (not ours, not the baseline).
    pub fn is_peer(self) -> bool {
        matches!(self, Kind::Rslock | Kind::Redlock | Kind::Redsync)
    }

    /// The slow peers sleep a jittered 0–300 ms between retries; they get fewer hand-off
    /// samples so the run stays bounded.
    pub fn sleeps_between_retries(self) -> bool {
        self.is_peer()
    }
}

/// A held lock, whichever implementation took it.
pub enum Guard {
    Ours(redlock_mux::Lock),
    Raw([u8; 40]),
    Rslock(rslock::Lock),
    Redlock { resource: Vec<u8>, val: Vec<u8> },
    Redsync(redsync::Lock),
}

/// One implementation's client, for one thread.
pub enum Locker {
    Ours(redlock_mux::Client),
    Raw(Raw, Tokens),
    Rslock(tokio::runtime::Runtime, rslock::LockManager),
    Redlock(redlock::RedLock),
    Redsync(redsync::Redsync<redsync::RedisInstance>),
}

fn urls(addrs: &[SocketAddr]) -> Vec<String> {
    addrs.iter().map(|a| format!("redis://{a}")).collect()
}

impl Locker {
    /// A client of `kind` over `addrs`.
    pub fn new(kind: Kind, addrs: &[SocketAddr]) -> Locker {
        let urls = urls(addrs);
        match kind {
            Kind::Ours => Locker::Ours(redlock_mux::Client::new(&urls).expect("client")),
            Kind::Raw => Locker::Raw(Raw::connect(addrs).expect("raw connect"), Tokens::new()),
            Kind::RawQ => Locker::Raw(
                Raw::connect(addrs).expect("raw connect").at_quorum(),
                Tokens::new(),
            ),
            Kind::Rslock => {
                // A current-thread runtime per thread: the lowest latency rslock can have, with
                // its connection tasks on the thread that awaits them.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let manager = {
                    let _entered = rt.enter();
                    rslock::LockManager::new(urls)
                };
                Locker::Rslock(rt, manager)
            }
            Kind::Redlock => Locker::Redlock(redlock::RedLock::new(urls)),
            Kind::Redsync => Locker::Redsync(redsync::Redsync::new(
                urls.iter()
                    .map(|u| redsync::RedisInstance::new(u.as_str()).expect("redsync instance"))
                    .collect(),
            )),
        }
    }

    /// One acquisition attempt as a user would make it when the key is free. For the peers
    /// that is their `lock` call, which retries only after a refusal.
    pub fn try_acquire(&mut self, key: &str) -> Option<Guard> {
        let ttl_ms = TTL.as_millis() as u64;
        match self {
            Locker::Ours(c) => c.try_lock(key, TTL).ok().map(Guard::Ours),
            Locker::Raw(raw, tokens) => {
                let token = tokens.next_token();
                match raw.try_acquire(key.as_bytes(), &token, ttl_ms) {
                    Ok(true) => Some(Guard::Raw(token)),
                    _ => None,
                }
            }
            Locker::Rslock(rt, m) => rt.block_on(m.lock(key, TTL)).ok().map(Guard::Rslock),
            Locker::Redlock(rl) => {
                rl.lock(key.as_bytes(), ttl_ms as usize)
                    .ok()
                    .flatten()
                    .map(|l| Guard::Redlock {
                        resource: l.resource,
                        val: l.val,
                    })
            }
            Locker::Redsync(rs) => rs.lock(key, TTL).ok().map(Guard::Redsync),
        }
    }

    /// Blocks until the lock is taken or `deadline` passes, with the implementation's own way
    /// of waiting: ours is woken by the release; the baseline polls without pause; the peers
    /// retry after their default jittered sleeps (their `acquire`-style loops, bounded here).
    pub fn wait_acquire(&mut self, key: &str, deadline: Instant) -> Option<Guard> {
        if let Locker::Ours(c) = self {
            return c.lock(key, TTL).ok().map(Guard::Ours);
        }
        if let Locker::Raw(raw, tokens) = self {
            let token = tokens.next_token();
            let ttl_ms = TTL.as_millis() as u64;
            return match raw.acquire_spinning(key.as_bytes(), &token, ttl_ms, deadline) {
                Ok(true) => Some(Guard::Raw(token)),
                _ => None,
            };
        }
        while Instant::now() < deadline {
            if let Some(g) = self.try_acquire(key) {
                return Some(g);
            }
        }
        None
    }

    /// Releases a lock this locker took on `key`; false if the implementation reported a
    /// failure (the peers' releases are best effort and report none).
    pub fn release(&mut self, key: &str, guard: Guard) -> bool {
        match (self, guard) {
            (Locker::Ours(_), Guard::Ours(lock)) => lock.release().is_ok(),
            (Locker::Raw(raw, _), Guard::Raw(token)) => raw.release(key.as_bytes(), &token).is_ok(),
            (Locker::Rslock(rt, _), Guard::Rslock(lock)) => {
                rt.block_on(lock.release());
                true
            }
            (Locker::Redlock(rl), Guard::Redlock { resource, val }) => {
                rl.unlock(&redlock::Lock {
                    resource,
                    val,
                    validity_time: 0,
                    lock_manager: rl,
                });
                true
            }
            (Locker::Redsync(rs), Guard::Redsync(lock)) => rs.unlock(&lock).is_ok(),
            _ => panic!("a guard released through another implementation"),
        }
    }
}
