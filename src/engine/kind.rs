//! Which command each kind of lock sends at each step of its lifecycle, in one place.
//!
//! A lock kind is a set of keys ([`Keys`]) and, for a fenced lock, its fence counter. The
//! state machines ask [`Spec::with_op`] for the [`Op`] of a step ([`Cmd`]): acquire, clean up a
//! lost attempt, leave the fair queue, withdraw a writer's intent, write the fencing token
//! back, extend, release, downgrade a write lock to a read lock (and undo a lost downgrade). Nothing else in the engine knows which script a kind uses.
#![forbid(unsafe_code)]

use crate::engine::fair::{AttemptIds, FairAcquire, FairState, Leave, QueueKeys};
use crate::engine::fencing::{
    FairFencedAcquire, FenceRead, FenceWrite, FencedAcquire, FencedWriteAcquire,
};
use crate::engine::keys::{self, Family, RwKeys, SemKeys};
use crate::engine::multi::{AcquireAll, ExtendAll, FairAcquireAll, ReleaseAll};
use crate::engine::ops::{Acquire, Extend, Op, Release};
use crate::engine::ops::{Caps, ScriptForm, Verdict};
use crate::engine::round::quorum;
use crate::engine::rw::{
    self, Downgrade, DowngradeUndo, FairRwAcquire, ReadAcquire, ReadExtend, ReadRelease,
    SetRelease, WriteAcquire, WriteCleanup, WriteExtend, WriteRelease,
};
use crate::engine::sem::{
    FairSemAcquire, FairSemKeyAcquire, SemAcquire, SemExtend, SemKeyAcquire, SemKeyExtend,
    SemKeyRelease, SemRelease,
};
use crate::engine::Vote;
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply};

/// The keys of a lock, by kind, borrowed from whoever owns them (a guard).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Keys<'a> {
    /// The mutex on this key.
    Mutex(&'a [u8]),
    /// The read side of the read-write lock on `resource`.
    Read {
        /// The resource key.
        resource: &'a [u8],
        /// Its read-write lock's keys.
        keys: &'a RwKeys,
    },
    /// The write side of the read-write lock on `resource`.
    Write {
        /// The resource key.
        resource: &'a [u8],
        /// Its read-write lock's keys.
        keys: &'a RwKeys,
    },
    /// Every key of an all-or-none set, sorted, without duplicates.
    All(&'a [&'a [u8]]),
    /// A counting semaphore on `resource`.
    Semaphore {
        /// The resource key.
        resource: &'a [u8],
        /// Its keys.
        keys: &'a SemKeys,
        /// How many holders the semaphore admits.
        permits: u32,
        /// How many holders each node admits (its slots); with 1, a node's slot is one string
        /// key, taken and released as a mutex's key is.
        capacity: u32,
        /// How many nodes must admit a holder.
        quorum: usize,
    },
    /// The read side of the read-write lock on `resource`, held by a write lock that was
    /// downgraded: its reader entries are in the reader set (as [`Keys::Read`]'s are made by
    /// the read acquire scripts), and nodes the downgrade did not reach may still hold the
    /// writer key with the same token. It extends as a reader does, and its release removes
    /// both (the downgrade's undo), so a writer key left behind goes with it.
    Downgraded {
        /// The resource key.
        resource: &'a [u8],
        /// Its read-write lock's keys.
        keys: &'a RwKeys,
    },
}

/// What a lock is: its keys and, for a fenced lock, the key of its fence counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec<'a> {
    /// The keys.
    pub keys: Keys<'a>,
    /// The fence counter's key, for a lock that hands out fencing tokens.
    pub fence: Option<&'a [u8]>,
}

/// One step of a lock's lifecycle, with the values it needs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cmd<'c> {
    /// An acquisition attempt.
    Acquire {
        /// The attempt's token and the waiter's id.
        ids: AttemptIds<'c>,
        /// The TTL in milliseconds.
        ttl_ms: u64,
        /// The waiter's place in the fair queue, when it waits in one.
        fair: Option<&'c FairState>,
        /// How long a waiting writer's intent lives, in ms; 0 when it leaves none.
        intent_ms: u64,
        /// The read-write policy lets a plain (unfair, unfenced) read or write go without Lua
        /// on a node that has hash-field expiry: the policy is read-preferring, so readers need
        /// not heed writers' intents (see `engine::rw`, "Native nodes").
        native: bool,
        /// Where a fenced acquire collects the counters it reads.
        read: &'c FenceRead,
    },
    /// Undoes a lost attempt on every node.
    Cleanup {
        /// The attempt's token and the waiter's id.
        ids: AttemptIds<'c>,
        /// As in [`Cmd::Acquire`]: a waiting writer keeps its intent.
        intent_ms: u64,
    },
    /// A fair waiter leaves the queue of key number `key`.
    Leave {
        /// The waiter's id.
        waiter: &'c [u8],
        /// Which key's queue (always 0 but for an all-or-none set).
        key: usize,
    },
    /// A writer withdraws its intent.
    Withdraw {
        /// The waiter's id, which names the intent.
        waiter: &'c [u8],
    },
    /// Raises the fence counter to `value` where the lock still holds `token`.
    FenceWrite {
        /// The holder's token.
        token: &'c [u8],
        /// The fencing token.
        value: u64,
    },
    /// Resets the lock's TTL.
    Extend {
        /// The holder's token.
        token: &'c [u8],
        /// The new TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Releases the lock.
    Release {
        /// The holder's token.
        token: &'c [u8],
    },
    /// A write lock becomes a read lock with the same token (see [`Downgrade`]).
    Downgrade {
        /// The writer's token.
        token: &'c [u8],
        /// The reader's TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Undoes a lost downgrade on every node (see [`DowngradeUndo`]).
    DowngradeUndo {
        /// The writer's token.
        token: &'c [u8],
    },
}

/// What a lock that is not a write lock is sent for a downgrade step. Never sent: only a
/// write lock's guard offers the downgrade. Should it be, a `PING` keeps the replies in step,
/// and every node fails its vote.
#[derive(Debug, Clone, Copy)]
struct NotAWriteLock;

impl Op for NotAWriteLock {
    fn encode(&self, out: &mut Vec<u8>, _form: ScriptForm) {
        resp::encode_command(out, &[b"PING"]);
    }

    fn classify(&self, _reply: &Reply<'_>) -> Verdict {
        Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply))
    }
}

impl<'a> Spec<'a> {
    /// Whether a waiter of this kind leaves an intent when the policy is write-preferring.
    pub fn is_writer(&self) -> bool {
        matches!(self.keys, Keys::Write { .. })
    }

    /// How many nodes of `nodes` must grant (or extend, or acknowledge) this lock: the
    /// majority, but for a semaphore, whose quorum depends on its permits.
    pub fn quorum(&self, nodes: usize) -> usize {
        match self.keys {
            Keys::Semaphore { quorum, .. } => quorum,
            _ => quorum(nodes),
        }
    }

    /// How many nodes of `nodes` must acknowledge a release: the majority, but for a
    /// semaphore `nodes − quorum + 1`, enough that fewer than a quorum can still hold the
    /// permit (with a quorum of every node, one acknowledgement does).
    pub fn release_quorum(&self, nodes: usize) -> usize {
        match self.keys {
            Keys::Semaphore { quorum, .. } => (nodes + 1).saturating_sub(quorum).max(1),
            _ => quorum(nodes),
        }
    }

    /// How many fair queues a waiter of this kind stands in: one per key.
    pub fn queues(&self) -> usize {
        match self.keys {
            Keys::All(keys) => keys.len(),
            _ => 1,
        }
    }

    /// The resource keys whose wake channels announce releases that may free this lock.
    pub fn resources(&self) -> impl Iterator<Item = &'a [u8]> {
        let (one, all): (Option<&'a [u8]>, &'a [&'a [u8]]) = match self.keys {
            Keys::Mutex(key) => (Some(key), &[]),
            Keys::Read { resource, .. }
            | Keys::Write { resource, .. }
            | Keys::Semaphore { resource, .. }
            | Keys::Downgraded { resource, .. } => (Some(resource), &[]),
            Keys::All(keys) => (None, keys),
        };
        one.into_iter().chain(all.iter().copied())
    }

    /// Which lock's keys these are: the slot of its wake channels on a Redis Cluster member.
    pub fn family(&self) -> Family {
        match self.keys {
            Keys::Mutex(_) | Keys::All(_) => Family::Mutex,
            Keys::Read { .. } | Keys::Write { .. } | Keys::Downgraded { .. } => Family::Rw,
            Keys::Semaphore { .. } => Family::Semaphore,
        }
    }

    /// Whether `channel` is the wake channel of one of this lock's resource keys, as a
    /// standalone node or a Redis Cluster member names it.
    pub fn is_wake_channel(&self, channel: &[u8]) -> bool {
        let family = self.family();
        self.resources().any(|r| {
            [false, true].into_iter().any(|sharded| {
                let name = keys::wake_channel_for(r, family, sharded);
                name.len() == channel.len()
                    && name
                        .parts()
                        .iter()
                        .try_fold(channel, |rest, part| rest.strip_prefix(*part))
                        == Some(&[][..])
            })
        })
    }

    /// Writes `command` (`SUBSCRIBE` or `UNSUBSCRIBE`; `SSUBSCRIBE` or `SUNSUBSCRIBE` when
    /// `caps` says the node is a Redis Cluster member's master) with the wake channel of every
    /// resource key; returns how many channels that is.
    pub fn write_channels(&self, out: &mut Vec<u8>, subscribe: bool, caps: Caps) -> usize {
        let count = self.resources().count();
        let command: &[u8] = match (subscribe, caps.sharded) {
            (true, false) => b"SUBSCRIBE",
            (false, false) => b"UNSUBSCRIBE",
            (true, true) => b"SSUBSCRIBE",
            (false, true) => b"SUNSUBSCRIBE",
        };
        resp::write_array_len(out, 1 + count);
        resp::write_bulk(out, command);
        let family = self.family();
        for resource in self.resources() {
            keys::wake_channel_for(resource, family, caps.sharded).write_bulk(out);
        }
        count
    }

    /// Calls `f` with the command of step `cmd` for this lock.
    pub fn with_op<R>(&self, cmd: Cmd<'_>, f: impl FnOnce(&dyn Op) -> R) -> R {
        match cmd {
            Cmd::Acquire {
                ids,
                ttl_ms,
                fair,
                intent_ms,
                native,
                read,
            } => self.with_acquire(ids, ttl_ms, fair, intent_ms, native, read, f),
            Cmd::Cleanup { ids, intent_ms } => match self.keys {
                Keys::Mutex(key) => f(&Release {
                    key,
                    token: ids.token,
                }),
                Keys::Read { resource, keys } => f(&ReadRelease {
                    resource,
                    keys,
                    token: ids.token,
                    announce: false,
                }),
                Keys::Downgraded { resource, keys } => f(&SetRelease {
                    resource,
                    set: keys.readers(),
                    token: ids.token,
                }),
                Keys::Write { resource, keys } => f(&WriteCleanup {
                    resource,
                    keys,
                    ids,
                    intent_ms,
                }),
                Keys::All(keys) => f(&ReleaseAll::new(keys, ids.token)),
                Keys::Semaphore {
                    resource,
                    keys,
                    permits,
                    capacity: 1,
                    ..
                } => f(&SemKeyRelease {
                    resource,
                    key: keys.holders(),
                    token: ids.token,
                    permits,
                }),
                Keys::Semaphore { resource, keys, .. } => f(&SemRelease {
                    resource,
                    holders: keys.holders(),
                    token: ids.token,
                }),
            },
            Cmd::Leave { waiter, key } => {
                let leave = match self.keys {
                    Keys::Mutex(k) => Leave {
                        resource: k,
                        keys: QueueKeys::Mutex(k),
                        kind: b"",
                        family: Family::Mutex,
                        waiter,
                    },
                    Keys::Read { resource, keys } | Keys::Downgraded { resource, keys } => Leave {
                        resource,
                        keys: rw::queue_keys(keys),
                        kind: b"r",
                        family: Family::Rw,
                        waiter,
                    },
                    Keys::Write { resource, keys } => Leave {
                        resource,
                        keys: rw::queue_keys(keys),
                        kind: b"w",
                        family: Family::Rw,
                        waiter,
                    },
                    Keys::Semaphore { resource, keys, .. } => Leave {
                        resource,
                        keys: QueueKeys::Named {
                            lock: keys.holders(),
                            queue: keys.queue(),
                            expiries: keys.queue_expiries(),
                        },
                        kind: b"",
                        family: Family::Semaphore,
                        waiter,
                    },
                    Keys::All(keys) => {
                        let k = keys.get(key).copied().unwrap_or_default();
                        Leave {
                            resource: k,
                            keys: QueueKeys::Mutex(k),
                            kind: b"",
                            family: Family::Mutex,
                            waiter,
                        }
                    }
                };
                f(&leave)
            }
            Cmd::Withdraw { waiter } => {
                let (resource, set) = match self.keys {
                    Keys::Read { resource, keys }
                    | Keys::Write { resource, keys }
                    | Keys::Downgraded { resource, keys } => (resource, keys.intents()),
                    // Only writers leave intents; the others have none to withdraw.
                    Keys::Mutex(key) | Keys::Semaphore { resource: key, .. } => (key, &[][..]),
                    Keys::All(keys) => (keys.first().copied().unwrap_or_default(), &[][..]),
                };
                f(&SetRelease {
                    resource,
                    set,
                    token: waiter,
                })
            }
            Cmd::FenceWrite { token, value } => f(&FenceWrite {
                key: self.lock_key(),
                fence: self.fence.unwrap_or_default(),
                token,
                value,
            }),
            Cmd::Extend { token, ttl_ms } => match self.keys {
                Keys::Mutex(key) => f(&Extend { key, token, ttl_ms }),
                Keys::Read { keys, .. } | Keys::Downgraded { keys, .. } => f(&ReadExtend {
                    keys,
                    token,
                    ttl_ms,
                }),
                Keys::Write { keys, .. } => f(&WriteExtend {
                    keys,
                    token,
                    ttl_ms,
                }),
                Keys::All(keys) => f(&ExtendAll {
                    keys,
                    token,
                    ttl_ms,
                }),
                Keys::Semaphore {
                    keys,
                    permits,
                    capacity: 1,
                    ..
                } => f(&SemKeyExtend {
                    key: keys.holders(),
                    token,
                    ttl_ms,
                    permits,
                }),
                Keys::Semaphore { keys, .. } => f(&SemExtend {
                    holders: keys.holders(),
                    token,
                    ttl_ms,
                }),
            },
            Cmd::Release { token } => match self.keys {
                Keys::Mutex(key) => f(&Release { key, token }),
                Keys::Read { resource, keys } => f(&ReadRelease {
                    resource,
                    keys,
                    token,
                    announce: true,
                }),
                Keys::Write { resource, keys } => f(&WriteRelease {
                    resource,
                    keys,
                    token,
                }),
                Keys::All(keys) => f(&ReleaseAll::new(keys, token)),
                Keys::Semaphore {
                    resource,
                    keys,
                    permits,
                    capacity: 1,
                    ..
                } => f(&SemKeyRelease {
                    resource,
                    key: keys.holders(),
                    token,
                    permits,
                }),
                Keys::Semaphore { resource, keys, .. } => f(&SemRelease {
                    resource,
                    holders: keys.holders(),
                    token,
                }),
                Keys::Downgraded { resource, keys } => f(&DowngradeUndo {
                    resource,
                    keys,
                    token,
                }),
            },
            Cmd::Downgrade { token, ttl_ms } => match self.keys {
                Keys::Write { resource, keys } => f(&Downgrade {
                    resource,
                    keys,
                    token,
                    ttl_ms,
                }),
                _ => f(&NotAWriteLock),
            },
            Cmd::DowngradeUndo { token } => match self.keys {
                Keys::Write { resource, keys } | Keys::Downgraded { resource, keys } => {
                    f(&DowngradeUndo {
                        resource,
                        keys,
                        token,
                    })
                }
                _ => f(&NotAWriteLock),
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn with_acquire<R>(
        &self,
        ids: AttemptIds<'_>,
        ttl_ms: u64,
        fair: Option<&FairState>,
        intent_ms: u64,
        native: bool,
        read: &FenceRead,
        f: impl FnOnce(&dyn Op) -> R,
    ) -> R {
        let token = ids.token;
        match (self.keys, fair, self.fence) {
            (Keys::Mutex(key), None, Some(fence)) => f(&FencedAcquire {
                key,
                fence,
                token,
                ttl_ms,
                read,
            }),
            (Keys::Mutex(key), Some(fair), Some(fence)) => f(&FairFencedAcquire {
                key,
                fence,
                ids,
                ttl_ms,
                fair,
                read,
            }),
            (Keys::Mutex(key), Some(fair), None) => f(&FairAcquire::new(key, ids, ttl_ms, fair)),
            (Keys::Mutex(key), None, None) => f(&Acquire { key, token, ttl_ms }),
            (Keys::Read { keys, .. } | Keys::Downgraded { keys, .. }, Some(fair), _) => {
                f(&FairRwAcquire::read(keys, ids, ttl_ms, fair))
            }
            (Keys::Read { keys, .. } | Keys::Downgraded { keys, .. }, None, _) => f(&ReadAcquire {
                keys,
                token,
                ttl_ms,
                native,
            }),
            (Keys::Write { keys, .. }, fair, Some(fence)) => f(&FencedWriteAcquire {
                keys,
                fence,
                ids,
                ttl_ms,
                intent_ms,
                fair,
                read,
            }),
            (Keys::Write { keys, .. }, Some(fair), None) => {
                f(&FairRwAcquire::write(keys, ids, ttl_ms, intent_ms, fair))
            }
            (Keys::Write { keys, .. }, None, None) => f(&WriteAcquire {
                keys,
                ids,
                ttl_ms,
                intent_ms,
            }),
            (Keys::All(keys), Some(fair), _) => f(&FairAcquireAll {
                keys,
                ids,
                ttl_ms,
                fair,
            }),
            (Keys::All(keys), None, _) => f(&AcquireAll {
                keys,
                token,
                ttl_ms,
            }),
            (
                Keys::Semaphore {
                    keys,
                    permits,
                    capacity: 1,
                    ..
                },
                Some(fair),
                _,
            ) => f(&FairSemKeyAcquire {
                keys,
                ids,
                ttl_ms,
                permits,
                fair,
            }),
            (
                Keys::Semaphore {
                    keys,
                    permits,
                    capacity: 1,
                    ..
                },
                None,
                _,
            ) => f(&SemKeyAcquire {
                key: keys.holders(),
                token,
                ttl_ms,
                permits,
            }),
            (
                Keys::Semaphore {
                    keys,
                    permits,
                    capacity,
                    ..
                },
                Some(fair),
                _,
            ) => f(&FairSemAcquire {
                keys,
                ids,
                ttl_ms,
                shape: crate::engine::sem::shape_arg(permits, capacity),
                fair,
            }),
            (
                Keys::Semaphore {
                    keys,
                    permits,
                    capacity,
                    ..
                },
                None,
                _,
            ) => f(&SemAcquire {
                keys,
                token,
                ttl_ms,
                shape: crate::engine::sem::shape_arg(permits, capacity),
            }),
        }
    }

    /// The key that holds the holder's token as a string: the one a fence write-back checks.
    fn lock_key(&self) -> &'a [u8] {
        match self.keys {
            Keys::Mutex(key) => key,
            Keys::Read { keys, .. } | Keys::Write { keys, .. } | Keys::Downgraded { keys, .. } => {
                keys.writer()
            }
            Keys::All(keys) => keys.first().copied().unwrap_or_default(),
            Keys::Semaphore { keys, .. } => keys.holders(),
        }
    }
}
