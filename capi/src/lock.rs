//! The one lock handle, `redlock_mux_lock`, for every kind of lock, and its functions.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redlock::{
    FencedLock, FencedWriteLock, KeepAlive, KeptLock, Lock, MultiLock, Permit, ReadLock, WriteLock,
};

use crate::args::{arg_mut, arg_ref, copy_out, free_handle, millis, Out};
use crate::error::{
    boundary, boundary_void, failure_code, null, redlock_mux_result, Failure, REDLOCK_MUX_RELEASED,
    REDLOCK_MUX_UNSUPPORTED,
};

/// The length of a lock's token, in bytes: 40 hexadecimal characters (160 random bits).
pub const REDLOCK_MUX_TOKEN_LEN: usize = 40;
const _: () = assert!(REDLOCK_MUX_TOKEN_LEN == redlock::internals::TOKEN_LEN);

/// The kind of lock a `redlock_mux_lock` holds, as `redlock_mux_lock_kind` tells. The numbers
/// never change; new kinds get new numbers.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum redlock_mux_kind {
    /// The Redlock mutex: `redlock_mux_client_lock`, `_try_lock`, `_resume_lock`.
    REDLOCK_MUX_KIND_MUTEX = 1,
    /// The read side of a read-write lock, shared with other readers:
    /// `redlock_mux_client_read_lock`, `_try_read_lock`, `_resume_read_lock`, and a downgraded
    /// write lock.
    REDLOCK_MUX_KIND_READ = 2,
    /// The write side of a read-write lock: `redlock_mux_client_write_lock`,
    /// `_try_write_lock`, `_resume_write_lock`.
    REDLOCK_MUX_KIND_WRITE = 3,
    /// Every key of a set, or none: `redlock_mux_client_lock_all`, `_try_lock_all`,
    /// `_resume_lock_all`.
    REDLOCK_MUX_KIND_ALL = 4,
    /// The mutex with a fencing token: `redlock_mux_client_lock_fenced`, `_try_lock_fenced`.
    REDLOCK_MUX_KIND_FENCED_MUTEX = 5,
    /// The write lock with a fencing token: `redlock_mux_client_write_lock_fenced`,
    /// `_try_write_lock_fenced`.
    REDLOCK_MUX_KIND_FENCED_WRITE = 6,
    /// One permit of a counting semaphore: `redlock_mux_client_acquire_permit`,
    /// `_try_acquire_permit`, `_resume_permit`.
    REDLOCK_MUX_KIND_SEMAPHORE = 7,
}

use redlock_mux_kind::*;

impl redlock_mux_kind {
    /// What the kind is called in messages.
    fn name(self) -> &'static str {
        match self {
            REDLOCK_MUX_KIND_MUTEX => "a mutex",
            REDLOCK_MUX_KIND_READ => "a read lock",
            REDLOCK_MUX_KIND_WRITE => "a write lock",
            REDLOCK_MUX_KIND_ALL => "an all-or-none lock",
            REDLOCK_MUX_KIND_FENCED_MUTEX => "a fenced mutex",
            REDLOCK_MUX_KIND_FENCED_WRITE => "a fenced write lock",
            REDLOCK_MUX_KIND_SEMAPHORE => "a semaphore permit",
        }
    }
}

/// A held lock of any kind. Made by an acquisition function (`redlock_mux_client_lock`,
/// `redlock_mux_client_try_read_lock`, ..., `redlock_mux_client_acquire_permit`), freed by
/// `redlock_mux_lock_free`, which releases the lock first if it is still held.
///
/// Every kind has `_extend`, `_release`, `_validity_ms`, `_token`, `_key`, `_keep_alive`,
/// `_keep_alive_with_callback`, `_is_lost` and `_free`; what only some kinds have
/// (`_fencing_token`, `_downgrade`, `_key_count`, `_key_at`) gives `REDLOCK_MUX_UNSUPPORTED`
/// on the others. `redlock_mux_lock_kind` tells the kind.
pub struct redlock_mux_lock {
    /// The kind of what `state` holds or last held.
    kind: redlock_mux_kind,
    state: State,
}

/// Where a handle's lock is.
enum State {
    /// Held by the handle, extended by hand.
    Held(Guarded),
    /// Handed to the client's keeper thread, which extends it.
    Kept(Kept),
    /// Released, or lost in a failed downgrade: only `_free` may follow.
    Released,
}

/// A guard of each kind.
pub(crate) enum Guarded {
    Mutex(Lock),
    Read(ReadLock),
    Write(WriteLock),
    All(MultiLock),
    FencedMutex(FencedLock),
    FencedWrite(FencedWriteLock),
    Semaphore(Permit),
}

/// `$body` with `$guard` bound to the guard of whichever kind `$guarded` holds (by value, by
/// reference or by mutable reference, as `$guarded` is).
macro_rules! with_guard {
    ($guarded:expr, $guard:ident => $body:expr) => {
        match $guarded {
            Guarded::Mutex($guard) => $body,
            Guarded::Read($guard) => $body,
            Guarded::Write($guard) => $body,
            Guarded::All($guard) => $body,
            Guarded::FencedMutex($guard) => $body,
            Guarded::FencedWrite($guard) => $body,
            Guarded::Semaphore($guard) => $body,
        }
    };
}

macro_rules! guarded_from {
    ($($variant:ident($lock:ty): $kind:ident;)*) => {
        $(impl From<$lock> for Guarded {
            fn from(lock: $lock) -> Guarded {
                Guarded::$variant(lock)
            }
        })*

        impl Guarded {
            fn kind(&self) -> redlock_mux_kind {
                match self {
                    $(Guarded::$variant(_) => $kind,)*
                }
            }
        }
    };
}

guarded_from! {
    Mutex(Lock): REDLOCK_MUX_KIND_MUTEX;
    Read(ReadLock): REDLOCK_MUX_KIND_READ;
    Write(WriteLock): REDLOCK_MUX_KIND_WRITE;
    All(MultiLock): REDLOCK_MUX_KIND_ALL;
    FencedMutex(FencedLock): REDLOCK_MUX_KIND_FENCED_MUTEX;
    FencedWrite(FencedWriteLock): REDLOCK_MUX_KIND_FENCED_WRITE;
    Semaphore(Permit): REDLOCK_MUX_KIND_SEMAPHORE;
}

impl Guarded {
    /// The lock's resource key; a set's first, in sorted order.
    fn key(&self) -> &[u8] {
        match self {
            Guarded::Mutex(g) => g.key(),
            Guarded::Read(g) => g.key(),
            Guarded::Write(g) => g.key(),
            Guarded::All(g) => g.keys().next().unwrap_or_default(),
            Guarded::FencedMutex(g) => g.key(),
            Guarded::FencedWrite(g) => g.key(),
            Guarded::Semaphore(g) => g.key(),
        }
    }

    fn fencing_token(&self) -> Option<u64> {
        match self {
            Guarded::FencedMutex(g) => Some(g.fencing_token()),
            Guarded::FencedWrite(g) => Some(g.fencing_token()),
            _ => None,
        }
    }
}

/// A kept lock and what the C API keeps beside it.
struct Kept {
    /// The lost-lock callback, if one was given. Declared first, so that it is dropped (and
    /// disarmed) before the kept lock is.
    on_lost: Disarm,
    lock: KeptLock,
    /// A set's keys, sorted, copied when the set was kept: a kept lock tells its first only.
    keys: Vec<Vec<u8>>,
}

/// A C callback and its user data, called at most once, from the keeper thread.
struct LostCallback {
    f: unsafe extern "C" fn(*mut c_void, redlock_mux_result),
    user_data: *mut c_void,
}

// SAFETY: `user_data` is only handed back to `f`, on the keeper thread; the caller of
// `redlock_mux_lock_keep_alive_with_callback` promises that this is allowed.
unsafe impl Send for LostCallback {}

/// Where a kept lock's callback waits to be called; emptied when the handle is released or
/// freed, so that no call starts after that and none is still running when it returns.
type CallbackSlot = Arc<Mutex<Option<LostCallback>>>;

fn lock_slot(slot: &CallbackSlot) -> MutexGuard<'_, Option<LostCallback>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Silences a kept lock's callback when dropped, or when asked to, in the process that kept
/// the lock.
struct Disarm(Option<CallbackSlot>, u32);

impl Disarm {
    fn new(slot: Option<CallbackSlot>) -> Disarm {
        Disarm(slot, std::process::id())
    }

    /// Makes sure no lost-lock callback starts from now on, after waiting for one in progress.
    /// In a child after `fork()`, there is no keeper thread to call it, and the slot is never
    /// waited on: the parent's keeper thread may have held it at the fork, and it does not
    /// exist here.
    fn disarm(&self) {
        if let Some(slot) = &self.0 {
            if self.1 == std::process::id() {
                *lock_slot(slot) = None;
            }
        }
    }
}

impl Drop for Disarm {
    fn drop(&mut self) {
        self.disarm();
    }
}

impl redlock_mux_lock {
    pub(crate) fn new(lock: impl Into<Guarded>) -> redlock_mux_lock {
        let lock = lock.into();
        redlock_mux_lock {
            kind: lock.kind(),
            state: State::Held(lock),
        }
    }

    /// The failure of a call the handle's kind (or, kept, the handle) does not support.
    fn unsupported(&self, what: &str) -> Failure {
        Failure::new(
            REDLOCK_MUX_UNSUPPORTED,
            format!("{} has no {what}", self.kind.name()),
        )
    }
}

fn released() -> Failure {
    Failure::new(
        REDLOCK_MUX_RELEASED,
        "the lock was already released; only free its handle",
    )
}

fn kept_alive(what: &str) -> Failure {
    Failure::new(
        REDLOCK_MUX_UNSUPPORTED,
        format!("the lock is kept alive, and the keeper thread extends it: no {what}"),
    )
}

/// The handle at `lock`, to read.
///
/// # Safety
/// `lock` is NULL or a live handle not being changed by another thread.
unsafe fn handle<'a>(lock: *const redlock_mux_lock) -> Result<&'a redlock_mux_lock, Failure> {
    // SAFETY: forwarded caller promise.
    unsafe { arg_ref(lock, "lock") }
}

/// The handle at `lock`, to change.
///
/// # Safety
/// `lock` is NULL or a live handle used by no other thread.
unsafe fn handle_mut<'a>(lock: *mut redlock_mux_lock) -> Result<&'a mut redlock_mux_lock, Failure> {
    // SAFETY: forwarded caller promise.
    unsafe { arg_mut(lock, "lock") }
}

/// Writes to `*out_kind` the kind of lock the handle holds (or held, once released).
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_kind` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_kind(
    lock: *const redlock_mux_lock,
    out_kind: *mut redlock_mux_kind,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (handle(lock)?, Out::new(out_kind, "out_kind")?) };
        out.write(handle.kind);
        Ok(())
    })
}

/// Resets the lock's TTL to `ttl_ms` milliseconds on every node that still holds its token
/// (for a set, every key of it; for a permit, on every node that still admits it). Succeeds
/// only if a quorum agrees before the current validity ends. A failed extend never lengthens
/// the validity but may shorten it: nodes may have taken the new TTL (or take it later), so the
/// validity becomes the earlier of its current end and `ttl_ms` less the drift allowance from
/// the start of the attempt. A failed extend to a TTL longer than the validity left leaves the
/// lock as it was (held until its current validity ends, if it was held). A fencing token stays
/// the same. `REDLOCK_MUX_UNSUPPORTED` once the lock is kept alive: the keeper thread extends
/// it. `REDLOCK_MUX_OTHER_PROCESS` in a child after `fork()`, for a lock its parent took.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_extend(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { handle_mut(lock) }?;
        match &mut handle.state {
            State::Held(guarded) => with_guard!(guarded, g => g.extend(millis(ttl_ms)))?,
            State::Kept(_) => return Err(kept_alive("extend by hand")),
            State::Released => return Err(released()),
        }
        Ok(())
    })
}

/// Writes to `*out_ms` the time left, in whole milliseconds, before the lock may be granted to
/// someone else (for a set, any of its keys); 0 once it has run out. Work that may take longer
/// must extend the lock first. For a kept lock: the time left as of the last extension that
/// won, 0 once lost; it may wait while an extension is in flight, at most the node timeout.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_validity_ms(
    lock: *const redlock_mux_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (handle(lock)?, Out::new(out_ms, "out_ms")?) };
        let validity = match &handle.state {
            State::Held(guarded) => with_guard!(guarded, g => g.validity()),
            State::Kept(kept) => kept.lock.validity(),
            State::Released => return Err(released()),
        };
        out.write(u64::try_from(validity.as_millis()).unwrap_or(u64::MAX));
        Ok(())
    })
}

/// Copies the lock's token (`REDLOCK_MUX_TOKEN_LEN` bytes of ASCII hex, no NUL: the value
/// stored for this holder on every node that granted the lock; not the fencing token) into
/// `buf` and writes its length to `*out_n`. `REDLOCK_MUX_BUFFER_TOO_SMALL` if `buf_len` is
/// less than the token's length. The token lets another process rebuild the handle (the
/// `_resume_` acquisitions).
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `buf` is NULL or points
/// to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_token(
    lock: *const redlock_mux_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { handle(lock) }?;
        if buf.is_null() {
            return Err(null("buf"));
        }
        // SAFETY: forwarded caller promise.
        let out_n = unsafe { Out::new(out_n, "out_n") }?;
        let token = match &handle.state {
            State::Held(guarded) => with_guard!(guarded, g => g.token()),
            State::Kept(kept) => kept.lock.token(),
            State::Released => return Err(released()),
        };
        // SAFETY: `buf` is non-NULL with `buf_len` writable bytes (caller's promise), and
        // cannot overlap the token, which is ours.
        unsafe { copy_out(token, buf, buf_len, out_n, "token") }
    })
}

/// Writes a key the handle owns to the caller's two out slots.
fn write_key(out_key: Out<*const u8>, out_len: Out<usize>, key: &[u8]) {
    out_key.write(key.as_ptr());
    out_len.write(key.len());
}

/// Writes to `*out_key` and `*out_len` the lock's resource key, as it was given when the lock
/// was taken (for a semaphore permit, the semaphore's key; for a set, its first key in sorted
/// order). The bytes belong to the handle: they stay valid, unchanged, until the lock is
/// released or freed, and must not be freed or written by the caller.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_key` and `out_len`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_key(
    lock: *const redlock_mux_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out_key, out_len) = unsafe {
            (
                handle(lock)?,
                Out::new(out_key, "out_key")?,
                Out::new(out_len, "out_len")?,
            )
        };
        let key = match &handle.state {
            State::Held(guarded) => guarded.key(),
            State::Kept(kept) => kept.lock.key(),
            State::Released => return Err(released()),
        };
        write_key(out_key, out_len, key);
        Ok(())
    })
}

/// The keys of the set a handle holds, sorted.
fn set_keys(handle: &redlock_mux_lock) -> Result<Vec<&[u8]>, Failure> {
    match &handle.state {
        State::Held(Guarded::All(g)) => Ok(g.keys().collect()),
        State::Kept(kept) if handle.kind == REDLOCK_MUX_KIND_ALL => {
            Ok(kept.keys.iter().map(Vec::as_slice).collect())
        }
        State::Released => Err(released()),
        _ => Err(handle.unsupported("set of keys (redlock_mux_lock_key gives its key)")),
    }
}

/// Writes to `*out_count` the number of keys of an all-or-none lock.
/// `REDLOCK_MUX_UNSUPPORTED` for a lock of another kind, which is on one key
/// (`redlock_mux_lock_key`).
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_count` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_key_count(
    lock: *const redlock_mux_lock,
    out_count: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (handle(lock)?, Out::new(out_count, "out_count")?) };
        out.write(set_keys(handle)?.len());
        Ok(())
    })
}

/// Writes to `*out_key` and `*out_len` the key at `index` of an all-or-none lock's set, in
/// sorted order (bytewise, shorter first on a common prefix), so that index 0 is the smallest.
/// The bytes belong to the handle, as for `redlock_mux_lock_key`. An `index` not below the key
/// count gives `REDLOCK_MUX_INVALID_ARGUMENT`; a lock of another kind,
/// `REDLOCK_MUX_UNSUPPORTED`.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_key` and `out_len`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_key_at(
    lock: *const redlock_mux_lock,
    index: usize,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out_key, out_len) = unsafe {
            (
                handle(lock)?,
                Out::new(out_key, "out_key")?,
                Out::new(out_len, "out_len")?,
            )
        };
        let keys = set_keys(handle)?;
        let key = keys.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "key index {index}, but the set has {} keys",
                keys.len()
            ))
        })?;
        write_key(out_key, out_len, key);
        Ok(())
    })
}

/// Writes the lock's fencing token to `*out_token`: larger than that of every fenced grant of
/// the same key (for a fenced write lock, of the same resource's fenced write locks) that held
/// it before, smaller than that of every one after (across all clients; not consecutive). Send
/// it with every write to the protected store, which keeps the largest it has seen and refuses
/// smaller ones. Extending and keeping alive keep it. Tokens hold only while every node keeps
/// its counter through a crash (AOF with `appendfsync always`). `REDLOCK_MUX_UNSUPPORTED` for a
/// lock that has none (any kind but `REDLOCK_MUX_KIND_FENCED_MUTEX` and
/// `REDLOCK_MUX_KIND_FENCED_WRITE`).
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_token` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_fencing_token(
    lock: *const redlock_mux_lock,
    out_token: *mut u64,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (handle(lock)?, Out::new(out_token, "out_token")?) };
        let token = match &handle.state {
            State::Held(guarded) => guarded.fencing_token(),
            State::Kept(kept) => kept.lock.fencing_token(),
            State::Released => return Err(released()),
        };
        out.write(token.ok_or_else(|| handle.unsupported("fencing token"))?);
        Ok(())
    })
}

/// Turns a write lock (fenced or not) into a read lock on the same resource without ever
/// leaving it unlocked (see `WriteLock::downgrade` in the Rust API): one round, atomic on each
/// node, that adds our reader and then drops our writer key. Other readers may join at once;
/// no writer gets in between. `ttl_ms` is the read lock's TTL; 0 keeps the TTL the lock was
/// taken (or last extended) with.
///
/// On success the handle holds the read lock (`REDLOCK_MUX_KIND_READ`), with the same token
/// and no fencing token. On failure (`REDLOCK_MUX_CONTENDED`: the write lock was lost on too
/// many nodes; `REDLOCK_MUX_QUORUM_UNREACHABLE`; an expired validity; an invalid TTL) the round
/// was undone on every node and **nothing is held**: the handle is released, and must only be
/// freed. A lock that is not a write lock, or is kept alive, gives `REDLOCK_MUX_UNSUPPORTED`
/// and is left as it was. There is no upgrade (read to write): two readers upgrading at once
/// would wait for each other. In a child after `fork()`, a lock its parent took gives
/// `REDLOCK_MUX_OTHER_PROCESS`: nothing is sent, and the lock stays the parent's.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_downgrade(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { handle_mut(lock) }?;
        match &handle.state {
            State::Held(Guarded::Write(_) | Guarded::FencedWrite(_)) => {}
            State::Held(_) => return Err(handle.unsupported("downgrade (only write locks have)")),
            State::Kept(_) => return Err(kept_alive("downgrade")),
            State::Released => return Err(released()),
        }
        let downgrade = |writer: Guarded| match writer {
            Guarded::Write(g) if ttl_ms == 0 => g.downgrade(),
            Guarded::Write(g) => g.downgrade_for(millis(ttl_ms)),
            Guarded::FencedWrite(g) if ttl_ms == 0 => g.downgrade(),
            Guarded::FencedWrite(g) => g.downgrade_for(millis(ttl_ms)),
            _ => unreachable!("checked to be a write lock above"),
        };
        let State::Held(writer) = std::mem::replace(&mut handle.state, State::Released) else {
            unreachable!("checked to be held above");
        };
        let reader = downgrade(writer)?;
        *handle = redlock_mux_lock::new(reader);
        Ok(())
    })
}

/// Called when a kept lock is lost, with the `user_data` given to
/// `redlock_mux_lock_keep_alive_with_callback` and why: `REDLOCK_MUX_CONTENDED` when the
/// quorum refused an extension (the key expired, or holds someone else's token),
/// `REDLOCK_MUX_VALIDITY_EXPIRED` when no extension won before the validity ran out.
pub type redlock_mux_lost_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, reason: redlock_mux_result)>;

/// The body of both `_keep_alive` functions: hands the guard to the keeper thread, or, when
/// the settings are refused, leaves it where it was.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
unsafe fn keep_alive(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
    on_lost: Option<LostCallback>,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { handle_mut(lock) }?;
        let guarded = match std::mem::replace(&mut handle.state, State::Released) {
            State::Held(guarded) => guarded,
            other => {
                handle.state = other;
                return Err(match handle.state {
                    State::Kept(_) => kept_alive("second keep-alive"),
                    _ => released(),
                });
            }
        };
        let keys = match &guarded {
            Guarded::All(g) => g.keys().map(<[u8]>::to_vec).collect(),
            _ => Vec::new(),
        };
        let mut settings = KeepAlive::new(millis(ttl_ms));
        let slot = on_lost.map(|callback| Arc::new(Mutex::new(Some(callback))));
        if let Some(slot) = &slot {
            let slot = Arc::clone(slot);
            settings = settings.on_lost(move |lost| {
                let callback = lock_slot(&slot);
                if let Some(c) = callback.as_ref() {
                    // SAFETY: the caller of `redlock_mux_lock_keep_alive_with_callback`
                    // promises that `f` may be called with `user_data` from this thread.
                    unsafe { (c.f)(c.user_data, failure_code(&lost.error)) }
                }
            });
        }
        // Settings that cannot keep the lock are refused, and the lock stays where it was.
        let kept = with_guard!(guarded, g => g
            .keep_alive(settings)
            .map_err(|refused| (Guarded::from(refused.guard), refused.error)));
        match kept {
            Ok(lock) => {
                handle.state = State::Kept(Kept {
                    on_lost: Disarm::new(slot),
                    lock,
                    keys,
                });
                Ok(())
            }
            Err((guarded, error)) => {
                handle.state = State::Held(guarded);
                Err(error.into())
            }
        }
    })
}

/// Hands the lock to the client's keeper thread, which extends it to `ttl_ms` milliseconds
/// every `ttl_ms / 3`, and sooner when the validity left runs low, until the lock is released
/// or freed, or lost. The handle stays the caller's: `_validity_ms`, `_token`, `_key`,
/// `_fencing_token`, `_is_lost`, `_release` and `_free` work as before, while `_extend`,
/// `_downgrade` and another `_keep_alive` give `REDLOCK_MUX_UNSUPPORTED`. A `ttl_ms` that
/// cannot keep the lock (one the client refuses, or one too close to the drift allowance for
/// `ttl_ms / 3` to be less than the validity it gives) is refused with
/// `REDLOCK_MUX_INVALID_ARGUMENT`, and the lock stays held as before, not kept alive. In a
/// child after `fork()`, a lock its parent took is refused with `REDLOCK_MUX_OTHER_PROCESS`:
/// the parent's keeper thread keeps the parent's locks, and the child's keeper (its own, started
/// with its first kept lock) only the locks the child took.
///
/// A lost lock (an extension refused by the quorum, or no extension won before the validity
/// ran out) is reported by `redlock_mux_lock_is_lost`; poll it before each step that needs the
/// lock, or be called back (`redlock_mux_lock_keep_alive_with_callback`).
///
/// The keeper thread starts with the client's first kept lock, and ends on its own, within one
/// extension interval, once the client and every lock taken through it have been freed.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_keep_alive(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { keep_alive(lock, ttl_ms, None) }
}

/// Like `redlock_mux_lock_keep_alive`, and `on_lost(user_data, reason)` is called once if the
/// lock is lost. `user_data` is passed through untouched and may be NULL; `on_lost` must not
/// be NULL.
///
/// The callback runs on the client's keeper thread (one thread extends every kept lock of the
/// client), never on the caller's, and not at all once the lock has been released or freed:
/// `redlock_mux_lock_release` and `redlock_mux_lock_free` wait for a call in progress to
/// return, so `user_data` may be freed as soon as either returns. So the callback must be
/// quick, must be safe to run on another thread (use atomics or a mutex to hand anything
/// over), must not release or free the lock it reports (that would wait for itself), and must
/// not wait for a thread that may be releasing or freeing it.
///
/// # Safety
/// As for `redlock_mux_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
) -> redlock_mux_result {
    let Some(f) = on_lost else {
        return boundary(|| Err(null("on_lost")));
    };
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, Some(LostCallback { f, user_data })) }
}

/// Writes to `*out_lost` 1 if the lock is lost, 0 while it is held. A kept lock is lost when
/// an extension was refused by the quorum, or no extension won before the validity ran out; a
/// lock not kept alive, once its validity has run out. Once lost, always lost: stop work that
/// needs the lock.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_lost` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_is_lost(
    lock: *const redlock_mux_lock,
    out_lost: *mut u8,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (handle(lock)?, Out::new(out_lost, "out_lost")?) };
        let lost = match &handle.state {
            State::Held(guarded) => with_guard!(guarded, g => g.validity() == Duration::ZERO),
            State::Kept(kept) => kept.lock.is_lost(),
            State::Released => return Err(released()),
        };
        out.write(u8::from(lost));
        Ok(())
    })
}

/// Releases the lock on every node (a kept lock's extensions stop first, and no lost-lock
/// callback runs after this returns; a lost lock is released too, in case some node still
/// holds its token), and returns once a quorum has answered. A released permit is given back
/// and its waiters woken. Whatever the result, the handle is released afterwards: further calls
/// on it give `REDLOCK_MUX_RELEASED`, and it must still be freed with `redlock_mux_lock_free`.
///
/// In a child after `fork()`, a handle its parent took is a copy, not the lock: this gives
/// `REDLOCK_MUX_OTHER_PROCESS` and sends nothing, and the lock stays the parent's.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_release(
    lock: *mut redlock_mux_lock,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { handle_mut(lock) }?;
        match std::mem::replace(&mut handle.state, State::Released) {
            State::Held(guarded) => with_guard!(guarded, g => g.release())?,
            State::Kept(Kept { on_lost, lock, .. }) => {
                on_lost.disarm();
                lock.release()?;
            }
            State::Released => return Err(released()),
        }
        Ok(())
    })
}

/// Frees a lock handle. A lock still held is released first, best effort (call
/// `redlock_mux_lock_release` to learn whether that worked); a kept lock's extensions stop, and
/// no lost-lock callback runs after this returns. NULL is a no-op.
///
/// In a child after `fork()`, freeing a handle its parent took (as cleanup code and `atexit`
/// handlers do) only frees the child's copy: nothing is sent, and the lock stays the parent's,
/// held and kept alive as before. Release, extend, downgrade and keep-alive of such a handle
/// give `REDLOCK_MUX_OTHER_PROCESS`; `_validity_ms` and `_is_lost` tell what the parent's handle
/// told at the fork, counting down. A child takes locks of its own for its own work (with
/// connections and a keeper thread of its own, made at its first use of the client).
///
/// # Safety
/// `lock` is NULL or a lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_free(lock: *mut redlock_mux_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}
