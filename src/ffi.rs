//! The C API, declared in `include/redlock_mux.h` (generated from this file by cbindgen).
//!
//! Conventions, the same for every function:
//!
//! - **Handles are opaque.** `redlock_mux_client_builder`, `redlock_mux_client` and the lock
//!   handles (`redlock_mux_lock`, `_read_lock`, `_write_lock`, `_multi_lock`, `_fenced_lock`,
//!   `_fenced_write_lock`, `_kept_lock`) and `redlock_mux_cancel` are only ever seen through
//!   pointers. Each one made by a `_new`, `_build` or lock function is owned by the caller and
//!   freed with the matching `_free`, which accepts NULL. Freeing twice, or using a handle after freeing it, is
//!   undefined behaviour.
//! - **Results are numbered.** Every fallible function returns a `redlock_mux_result`, whose
//!   values are fixed forever. `redlock_mux_result_text` names a code;
//!   `redlock_mux_last_error_message` gives the full message of the last failure on the
//!   calling thread (which nodes failed, and how), `redlock_mux_last_error_deadline` which
//!   deadline ended it.
//! - **NULL is checked.** Every pointer argument is checked, and NULL gives
//!   `REDLOCK_MUX_NULL_PARAMETER` before anything else happens.
//! - **Inputs are pointer plus length.** Keys are bytes and may contain NUL; URLs are UTF-8 and
//!   need no terminator. The library copies what it keeps: the caller's buffers may be reused
//!   as soon as a call returns.
//! - **Outputs are written only on success.** On any other result, every `out` argument is
//!   left exactly as it was.
//! - **Panics never cross into C.** Every function body runs inside a panic boundary; a panic
//!   (a bug in this library) comes back as `REDLOCK_MUX_PANIC`.
//!
//! Thread safety: a `redlock_mux_client` may be used from any number of threads at once, and
//! threads that lock at the same time do not wait on each other. A `redlock_mux_lock` or a
//! `redlock_mux_client_builder` may move between threads but must not be used by two threads at
//! once. A `redlock_mux_cancel` may be used from any number of threads at once: that is what it
//! is for. A lock keeps what it needs of its client alive: the client may be freed before the
//! locks taken through it. A kept lock is extended by the client's keeper thread, one per
//! client, which also runs the lost-lock callbacks.

// This is the one module of the crate that may use `unsafe`: C hands us raw pointers, and
// turning them into references cannot be done safely. Every such step goes through one of the
// small helpers below (`arg_ref`, `arg_mut`, `arg_bytes`, `out_ptr`, `into_handle`,
// `free_handle`), each of which checks for NULL first.
#![allow(unsafe_code)]
// The C names (`redlock_mux_client`, `REDLOCK_MUX_OK`) are what C programmers read in the header.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::kind::{Fenced, Kind, OneKey, Writer};
use crate::{
    Acquire, Cancel, Client, ClientBuilder, Deadline, Error, FencedLock, FencedWriteLock, Guard,
    InvalidArgument, KeepAlive, KeptLock, Lock, MultiLock, NodeStats, Permit, ReadLock, RoundStats,
    RwPolicy, WriteLock, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS,
};

/// Every result a function of this API returns. The numbers never change; new results get new
/// numbers.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum redlock_mux_result {
    /// Success: the `out` arguments were written.
    REDLOCK_MUX_OK = 0,
    /// A pointer argument was NULL. Nothing was done.
    REDLOCK_MUX_NULL_PARAMETER = 1,
    /// An argument was rejected before anything was sent to any node: an empty or too long
    /// key, a zero or too large TTL, a bad node URL, an out-of-range option.
    REDLOCK_MUX_INVALID_ARGUMENT = 2,
    /// The lock is held by someone else: too many nodes refused for a quorum.
    REDLOCK_MUX_CONTENDED = 3,
    /// Too many nodes failed (down, timed out, erroring) for a quorum to be reached at all.
    REDLOCK_MUX_QUORUM_UNREACHABLE = 4,
    /// The validity ran out: the quorum answered later than the TTL allows, or an extend came
    /// after the lock's validity had ended.
    REDLOCK_MUX_VALIDITY_EXPIRED = 5,
    /// The local system refused a resource the client needs, such as a socket or a poller.
    REDLOCK_MUX_IO = 6,
    /// The output buffer is too small. Nothing was written.
    REDLOCK_MUX_BUFFER_TOO_SMALL = 7,
    /// The lock handle was already released, or its lock was handed to keep-alive (one of the
    /// `_keep_alive` functions); only its `_free` may follow.
    REDLOCK_MUX_RELEASED = 8,
    /// The library panicked: a bug. The handles involved must only be freed.
    REDLOCK_MUX_PANIC = 9,
    /// A node refused the setup of a connection (`AUTH`, `SELECT`), or answered it as no Redis
    /// server does: a node URL (user, password, database) or a server's configuration is
    /// wrong. Returned at once, never retried: `redlock_mux_client_builder_build` gives it when
    /// any node's setup fails, a lock call when too few nodes are left for a quorum without
    /// the misconfigured ones. Nothing is written on a node whose setup failed.
    REDLOCK_MUX_CONFIG = 10,
    /// A waiting acquisition was cancelled through its cancel handle before it got its lock.
    /// What it had on the nodes was undone.
    REDLOCK_MUX_CANCELLED = 11,
}

use redlock_mux_result::*;

/// Which deadline ended the last failed call on the calling thread, as
/// `redlock_mux_last_error_deadline` tells. The numbers never change; new deadlines get new
/// numbers.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum redlock_mux_deadline {
    /// No deadline ended it: the nodes decided (they refused or failed) before any deadline,
    /// the failure was not about time (a NULL or invalid argument, a configuration error), or
    /// no call has failed on this thread yet.
    REDLOCK_MUX_DEADLINE_NONE = 0,
    /// The client's wait timeout: a waiting call gave up, and no attempt starts after it.
    REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT = 1,
    /// The client's retry count: a waiting call gave up after that many retries that no
    /// release announcement prompted.
    REDLOCK_MUX_DEADLINE_RETRY_COUNT = 2,
    /// The lock's validity: the quorum answered later than the TTL allows, or an extend came
    /// after the validity had ended (`REDLOCK_MUX_VALIDITY_EXPIRED`).
    REDLOCK_MUX_DEADLINE_VALIDITY = 3,
    /// The per-node timeout: nodes that had not answered in time were counted as failed,
    /// which decided the round.
    REDLOCK_MUX_DEADLINE_NODE_TIMEOUT = 4,
}

use redlock_mux_deadline::*;

/// The length of a lock's token, in bytes: 40 hexadecimal characters (160 random bits).
pub const REDLOCK_MUX_TOKEN_LEN: usize = 40;
const _: () = assert!(REDLOCK_MUX_TOKEN_LEN == crate::rng::TOKEN_LEN);

/// The longest key accepted, in bytes.
pub const REDLOCK_MUX_MAX_KEY_LEN: usize = 64 * 1024;
const _: () = assert!(REDLOCK_MUX_MAX_KEY_LEN == MAX_KEY_LEN);

/// The most keys one `redlock_mux_client_lock_all` may cover.
pub const REDLOCK_MUX_MAX_LOCK_ALL_KEYS: usize = 256;
const _: () = assert!(REDLOCK_MUX_MAX_LOCK_ALL_KEYS == MAX_LOCK_ALL_KEYS);

/// Builds a `redlock_mux_client`: node URLs and options. Made by
/// `redlock_mux_client_builder_new`, freed by `redlock_mux_client_builder_free`.
///
/// A setter that fails (a NULL argument, a URL that is not UTF-8, an unknown policy) leaves the
/// builder exactly as it was: the nodes and settings given before are kept. The values of
/// options (a zero timeout, a drift factor out of range, a malformed URL) are checked by
/// `redlock_mux_client_builder_build`, which also leaves the builder as it was: set a good
/// value in place of the bad one and build again.
pub struct redlock_mux_client_builder {
    builder: ClientBuilder,
}

/// A Redlock client over N Redis masters. Made by `redlock_mux_client_builder_build`, freed by
/// `redlock_mux_client_free`. Safe to use from many threads at once.
pub struct redlock_mux_client {
    client: Client,
}

/// A held Redlock mutex. Made by `redlock_mux_client_lock` or `redlock_mux_client_try_lock`,
/// freed by `redlock_mux_lock_free` (which releases it first if it is still held).
pub struct redlock_mux_lock {
    held: Option<Lock>,
}

/// A held read lock (shared with other readers). Made by `redlock_mux_client_read_lock` or
/// `redlock_mux_client_try_read_lock`, freed by `redlock_mux_read_lock_free` (which releases it
/// first if it is still held).
pub struct redlock_mux_read_lock {
    held: Option<ReadLock>,
}

/// A held write lock (exclusive of readers and other writers). Made by
/// `redlock_mux_client_write_lock` or `redlock_mux_client_try_write_lock`, freed by
/// `redlock_mux_write_lock_free` (which releases it first if it is still held).
pub struct redlock_mux_write_lock {
    held: Option<WriteLock>,
}

/// A held all-or-none lock over a set of keys. Made by `redlock_mux_client_lock_all` or
/// `redlock_mux_client_try_lock_all`, freed by `redlock_mux_multi_lock_free` (which releases it
/// first if it is still held).
pub struct redlock_mux_multi_lock {
    held: Option<MultiLock>,
}

/// A held mutex with a fencing token. Made by `redlock_mux_client_lock_fenced` or
/// `redlock_mux_client_try_lock_fenced`, freed by `redlock_mux_fenced_lock_free` (which
/// releases it first if it is still held).
pub struct redlock_mux_fenced_lock {
    held: Option<FencedLock>,
}

/// A held write lock with a fencing token. Made by `redlock_mux_client_write_lock_fenced` or
/// `redlock_mux_client_try_write_lock_fenced`, freed by `redlock_mux_fenced_write_lock_free`
/// (which releases it first if it is still held).
pub struct redlock_mux_fenced_write_lock {
    held: Option<FencedWriteLock>,
}

/// One held permit of a counting semaphore. Made by `redlock_mux_client_acquire_permit` or
/// `redlock_mux_client_try_acquire_permit`, freed by `redlock_mux_permit_free` (which releases
/// it first if it is still held).
pub struct redlock_mux_permit {
    held: Option<Permit>,
}

/// A lock of any kind extended in the background by its client's keeper thread. Made from a
/// lock handle by its `_keep_alive` or `_keep_alive_with_callback` function (such as
/// `redlock_mux_lock_keep_alive`), freed by `redlock_mux_kept_lock_free` (which
/// stops the extensions and releases it first if it is still held).
pub struct redlock_mux_kept_lock {
    held: Option<KeptLock>,
    /// The lost-lock callback, if one was given.
    on_lost: Option<CallbackSlot>,
}

impl redlock_mux_kept_lock {
    /// Makes sure no lost-lock callback starts from now on, after waiting for one in progress.
    fn disarm(&self) {
        if let Some(slot) = &self.on_lost {
            *lock_slot(slot) = None;
        }
    }
}

impl Drop for redlock_mux_kept_lock {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// `redlock_mux_client_builder_set_rw_policy`: new readers get in whenever no writer holds the
/// lock (the default). A stream of overlapping readers can keep a writer out.
pub const REDLOCK_MUX_RW_READ_PREFERRING: u32 = 0;
/// `redlock_mux_client_builder_set_rw_policy`: a waiting writer keeps new readers out, so the
/// readers in place drain and the writer gets in within one reader hold.
pub const REDLOCK_MUX_RW_WRITE_PREFERRING: u32 = 1;

/// A failed call: its code, the message `redlock_mux_last_error_message` gives, and the
/// deadline `redlock_mux_last_error_deadline` gives.
struct Failure {
    code: redlock_mux_result,
    message: String,
    deadline: redlock_mux_deadline,
}

impl Failure {
    fn new(code: redlock_mux_result, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            deadline: REDLOCK_MUX_DEADLINE_NONE,
        }
    }
}

/// The number of the deadline that ended an operation.
fn deadline_code(deadline: Option<Deadline>) -> redlock_mux_deadline {
    // Exhaustive on purpose: a new deadline must be given its own number here.
    match deadline {
        None => REDLOCK_MUX_DEADLINE_NONE,
        Some(Deadline::WaitTimeout) => REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT,
        Some(Deadline::RetryCount) => REDLOCK_MUX_DEADLINE_RETRY_COUNT,
        Some(Deadline::Validity) => REDLOCK_MUX_DEADLINE_VALIDITY,
        Some(Deadline::NodeTimeout) => REDLOCK_MUX_DEADLINE_NODE_TIMEOUT,
    }
}

/// The result code of an error.
fn failure_code(e: &Error) -> redlock_mux_result {
    // Exhaustive on purpose: a new kind of error must be given its own number here.
    match e {
        Error::InvalidArgument(_) => REDLOCK_MUX_INVALID_ARGUMENT,
        Error::Contended { .. } => REDLOCK_MUX_CONTENDED,
        Error::QuorumUnreachable { .. } => REDLOCK_MUX_QUORUM_UNREACHABLE,
        Error::ValidityExpired { .. } => REDLOCK_MUX_VALIDITY_EXPIRED,
        Error::Io(_) => REDLOCK_MUX_IO,
        Error::Config { .. } => REDLOCK_MUX_CONFIG,
        // A wait that ended is reported as its last attempt was (most often contended); the
        // message names the deadline.
        Error::WaitEnded { last, .. } => failure_code(last),
        Error::Cancelled => REDLOCK_MUX_CANCELLED,
        // Only `Client::close` returns it, which the C API does not offer.
        Error::Undelivered { .. } => REDLOCK_MUX_QUORUM_UNREACHABLE,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: failure_code(&e),
            message: e.to_string(),
            deadline: deadline_code(e.deadline()),
        }
    }
}

impl From<InvalidArgument> for Failure {
    fn from(a: InvalidArgument) -> Failure {
        Error::from(a).into()
    }
}

/// What is kept of the last failed call on a thread.
struct LastError {
    message: String,
    deadline: redlock_mux_deadline,
}

thread_local! {
    /// The last failed call on this thread.
    static LAST_ERROR: RefCell<LastError> = const {
        RefCell::new(LastError {
            message: String::new(),
            deadline: REDLOCK_MUX_DEADLINE_NONE,
        })
    };
}

fn set_last_error(message: String, deadline: redlock_mux_deadline) {
    // `try_with`: during thread teardown the slot may be gone; the code still gets through.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = LastError { message, deadline });
}

/// The panic boundary every exported function runs in: a panic becomes `REDLOCK_MUX_PANIC`,
/// a failure records its message for `redlock_mux_last_error_message`.
fn boundary(body: impl FnOnce() -> Result<(), Failure>) -> redlock_mux_result {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => REDLOCK_MUX_OK,
        Ok(Err(failure)) => {
            set_last_error(failure.message, failure.deadline);
            failure.code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(
                format!("redlock-mux panicked (a bug in the library): {what}"),
                REDLOCK_MUX_DEADLINE_NONE,
            );
            REDLOCK_MUX_PANIC
        }
    }
}

/// The panic boundary for functions that return nothing (the `_free` ones).
fn boundary_void(body: impl FnOnce()) {
    let _ = boundary(|| {
        body();
        Ok(())
    });
}

fn null(name: &str) -> Failure {
    Failure::new(REDLOCK_MUX_NULL_PARAMETER, format!("`{name}` is NULL"))
}

/// `&*p`, after checking for NULL.
///
/// # Safety
/// `p` is NULL or points to a live `T` not being mutated for `'a`.
unsafe fn arg_ref<'a, T>(p: *const T, name: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller vouches for non-NULL pointers; NULL is turned into an error here.
    unsafe { p.as_ref() }.ok_or_else(|| null(name))
}

/// `&mut *p`, after checking for NULL.
///
/// # Safety
/// `p` is NULL or points to a live `T` that nothing else uses for `'a`.
unsafe fn arg_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: as for `arg_ref`, plus exclusivity, which the header asks of the caller.
    unsafe { p.as_mut() }.ok_or_else(|| null(name))
}

/// The `len` bytes at `p`, after checking for NULL (even when `len` is 0) and for a length no
/// slice can have.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay unchanged for `'a`.
unsafe fn arg_bytes<'a>(p: *const u8, len: usize, name: &str) -> Result<&'a [u8], Failure> {
    if p.is_null() {
        return Err(null(name));
    }
    if len > isize::MAX as usize {
        return Err(Failure::new(
            REDLOCK_MUX_INVALID_ARGUMENT,
            format!("invalid argument: `{name}_len` {len} is larger than any buffer can be"),
        ));
    }
    // SAFETY: non-NULL, in bounds by the caller's promise, length checked just above.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A key: like `arg_bytes`, but a length over the cap is refused before the slice is made, so
/// a wrong length cannot make us form a slice past the caller's buffer.
///
/// # Safety
/// As for `arg_bytes`.
unsafe fn arg_key<'a>(p: *const u8, len: usize, name: &str) -> Result<&'a [u8], Failure> {
    if !p.is_null() && len > MAX_KEY_LEN {
        return Err(InvalidArgument::KeyTooLong {
            len,
            max: MAX_KEY_LEN,
        }
        .into());
    }
    // SAFETY: forwarded caller promise.
    unsafe { arg_bytes(p, len, name) }
}

/// An output slot, checked for NULL before any work is done, so that a call never does
/// something (such as taking a lock) whose result it then cannot hand back.
struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `p` is NULL or valid for a write of one `T` (not necessarily initialised).
    unsafe fn new(p: *mut T, name: &str) -> Result<Out<T>, Failure> {
        if p.is_null() {
            return Err(null(name));
        }
        Ok(Out(p))
    }

    fn write(self, value: T) {
        // SAFETY: checked non-NULL and writable in `new`; `write` does not drop whatever
        // uninitialised value the caller had there.
        unsafe { ptr::write(self.0, value) }
    }
}

/// A heap handle the caller now owns.
fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back a handle made by `into_handle` and drops it; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from `into_handle::<T>` and was not freed yet.
unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: made by `Box::into_raw` of the same type, freed once, by the caller's promise.
        drop(unsafe { Box::from_raw(p) });
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The static text of a result code, such as `"contended"`. Never NULL; the string lives for
/// the whole program and must not be freed. Unknown codes give `"unknown result code"`.
#[no_mangle]
pub extern "C" fn redlock_mux_result_text(result: u32) -> *const c_char {
    let text: &'static CStr = match result {
        0 => c"ok",
        1 => c"a pointer argument is NULL",
        2 => c"invalid argument",
        3 => c"contended: the lock is held elsewhere",
        4 => c"quorum unreachable",
        5 => c"validity expired",
        6 => c"local I/O resource unavailable",
        7 => c"output buffer too small",
        8 => c"lock already released",
        9 => c"panic in redlock-mux",
        10 => c"node configuration error",
        11 => c"cancelled",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

/// The library's version, such as `"0.1.0"`. Never NULL; static, must not be freed.
#[no_mangle]
pub extern "C" fn redlock_mux_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => panic!("the version contains a NUL"),
        };
    VERSION.as_ptr()
}

/// The length in bytes of the message of the last failed call on the calling thread, not
/// counting a terminating NUL; 0 if no call has failed on this thread yet.
#[no_mangle]
pub extern "C" fn redlock_mux_last_error_length() -> usize {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().message.len())
            .unwrap_or(0)
    })
    .unwrap_or(0)
}

/// Which deadline ended the last failed call on the calling thread: for a waiting acquisition
/// that gave up (it returns the result of its last attempt, most often
/// `REDLOCK_MUX_CONTENDED`), `REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT` or
/// `REDLOCK_MUX_DEADLINE_RETRY_COUNT`; `REDLOCK_MUX_DEADLINE_VALIDITY` or
/// `REDLOCK_MUX_DEADLINE_NODE_TIMEOUT` for a round that time decided;
/// `REDLOCK_MUX_DEADLINE_NONE` when no deadline did, or no call has failed on this thread yet.
/// Like the message, it belongs to the last failure: calls that succeed, and asking, do not
/// change it.
#[no_mangle]
pub extern "C" fn redlock_mux_last_error_deadline() -> redlock_mux_deadline {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().deadline)
            .unwrap_or(REDLOCK_MUX_DEADLINE_NONE)
    })
    .unwrap_or(REDLOCK_MUX_DEADLINE_NONE)
}

/// Copies the message of the last failed call on the calling thread into `buf`, followed by a
/// NUL, and writes its length (without the NUL) to `*out_n`. The message is empty if no call
/// has failed on this thread yet. This function never changes the recorded message.
///
/// Returns `REDLOCK_MUX_BUFFER_TOO_SMALL` if `buf_len` is less than
/// `redlock_mux_last_error_length() + 1`.
///
/// # Safety
/// `buf` is NULL or points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_last_error_message(
    buf: *mut c_char,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // Not through `boundary`: a failure here must not overwrite the message being asked for.
    catch_unwind(AssertUnwindSafe(|| {
        if buf.is_null() || out_n.is_null() {
            return REDLOCK_MUX_NULL_PARAMETER;
        }
        let copied = LAST_ERROR.try_with(|slot| {
            let message = &slot.borrow().message;
            if buf_len < message.len() + 1 {
                return None;
            }
            // SAFETY: `buf` is non-NULL with room for `buf_len >= len + 1` bytes (caller's
            // promise); the source is our own string, which cannot overlap it.
            unsafe {
                ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), message.len());
                *buf.add(message.len()) = 0;
            }
            Some(message.len())
        });
        match copied {
            Ok(Some(n)) => {
                // SAFETY: checked non-NULL above; writable by the caller's promise.
                unsafe { ptr::write(out_n, n) };
                REDLOCK_MUX_OK
            }
            Ok(None) => REDLOCK_MUX_BUFFER_TOO_SMALL,
            Err(_) => REDLOCK_MUX_PANIC,
        }
    }))
    .unwrap_or(REDLOCK_MUX_PANIC)
}

/// Makes a client builder with default settings and no nodes, and writes it to `*out`. Free it
/// with `redlock_mux_client_builder_free`; building does not consume it.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_new(
    out: *mut *mut redlock_mux_client_builder,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let out = unsafe { Out::new(out, "out") }?;
        out.write(into_handle(redlock_mux_client_builder {
            builder: Client::builder(),
        }));
        Ok(())
    })
}

/// Frees a builder. NULL is a no-op.
///
/// # Safety
/// `builder` is NULL or a builder not yet freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_free(builder: *mut redlock_mux_client_builder) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(builder) })
}

/// Changes a builder through the Rust builder's by-value setters, all or nothing: `f` works on
/// a copy, which replaces the builder only once `f` has succeeded. A setter that fails (or
/// panics) thus leaves the builder exactly as it was, as the header promises.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
unsafe fn update(
    builder: *mut redlock_mux_client_builder,
    f: impl FnOnce(ClientBuilder) -> Result<ClientBuilder, Failure>,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { arg_mut(builder, "builder") }?;
        handle.builder = f(handle.builder.clone())?;
        Ok(())
    })
}

/// Adds one node, as `redis://[user:password@]host:port[/db]` or bare `host:port`, given as
/// `url_len` bytes of UTF-8 (no terminating NUL needed). The URL is checked and resolved by
/// `redlock_mux_client_builder_build`. The quorum is N / 2 + 1 of the nodes added.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread; `url` is NULL or points to
/// `url_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_add_node(
    builder: *mut redlock_mux_client_builder,
    url: *const c_char,
    url_len: usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        update(builder, |b| {
            let bytes = arg_bytes(url.cast::<u8>(), url_len, "url")?;
            let url = std::str::from_utf8(bytes).map_err(|_| {
                Failure::new(
                    REDLOCK_MUX_INVALID_ARGUMENT,
                    "invalid argument: the node URL is not UTF-8",
                )
            })?;
            Ok(b.nodes([url]))
        })
    }
}

/// How long to wait for one node's reply before counting it as failed, in milliseconds. Keep it
/// small next to the TTL. Default 50. Zero is rejected by `redlock_mux_client_builder_build`.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_node_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.node_timeout(millis(ms)))) }
}

/// How long a TCP connect may take, in milliseconds. Default 1000. Zero is rejected by
/// `redlock_mux_client_builder_build`.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_connect_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.connect_timeout(millis(ms)))) }
}

/// How many times `redlock_mux_client_lock` (and every other waiting call) may retry on its own:
/// after a retry delay in which no release was announced. Retries that a release announcement
/// prompts are not counted; the wait timeout bounds them. 0 makes a single attempt. Default
/// `UINT32_MAX`, which means no limit: the wait timeout alone bounds the wait.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_retry_count(
    builder: *mut redlock_mux_client_builder,
    count: u32,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.retry_count(count))) }
}

/// The base delay between attempts of `redlock_mux_client_lock` when no release is announced,
/// in milliseconds: a waiter retries at once when one is. Each delay is drawn from [d/2, 3d/2).
/// Default 50.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_retry_delay_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.retry_delay(millis(ms)))) }
}

/// The longest `redlock_mux_client_lock` (and every other waiting call) waits in all, in
/// milliseconds, whatever the retry count; with the default retry count, this alone bounds the
/// wait. Default 10000.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_wait_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.wait_timeout(millis(ms)))) }
}

/// Clock drift between processes allowed for, as a fraction of the TTL; 2 ms are always added.
/// Must be in [0, 0.5), which `redlock_mux_client_builder_build` checks. Default 0.01.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_drift_factor(
    builder: *mut redlock_mux_client_builder,
    factor: f64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.drift_factor(factor))) }
}

/// Serves waiters in arrival order when `fair` is non-zero: under contention, waiters queue on
/// every node and only the head of the queue may take the lock, so nobody starves. Default 0
/// (off).
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_fair(
    builder: *mut redlock_mux_client_builder,
    fair: u8,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.fair(fair != 0))) }
}

/// With fairness on: an acquirer joins an empty queue once it has waited this many
/// milliseconds (it always joins a non-empty one). Default 0: join at the first retry.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_fair_after_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.fair_after(millis(ms)))) }
}

/// Whom read-write locks favour when readers hold a lock and a writer waits:
/// `REDLOCK_MUX_RW_READ_PREFERRING` (the default) or `REDLOCK_MUX_RW_WRITE_PREFERRING`. Any
/// other value gives `REDLOCK_MUX_INVALID_ARGUMENT` and leaves the builder as it was.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_rw_policy(
    builder: *mut redlock_mux_client_builder,
    policy: u32,
) -> redlock_mux_result {
    let policy = match policy {
        REDLOCK_MUX_RW_READ_PREFERRING => Some(RwPolicy::ReadPreferring),
        REDLOCK_MUX_RW_WRITE_PREFERRING => Some(RwPolicy::WritePreferring),
        _ => None,
    };
    // SAFETY: forwarded caller promise.
    unsafe {
        update(builder, |b| match policy {
            Some(p) => Ok(b.rw_policy(p)),
            None => Err(Failure::new(
                REDLOCK_MUX_INVALID_ARGUMENT,
                "invalid argument: unknown read-write policy",
            )),
        })
    }
}

/// Checks every setting, resolves every node, connects to every node (waiting at most the
/// connect timeout), and writes a new client to `*out`. A node that is down does not make this
/// fail; a node that refuses the connection setup (a wrong password, a database it does not
/// have) gives `REDLOCK_MUX_CONFIG` at once. The builder is left as it was and must still be
/// freed. Free the client with `redlock_mux_client_free`.
///
/// # Safety
/// `builder` is NULL or a live builder not being changed by another thread; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_build(
    builder: *const redlock_mux_client_builder,
    out: *mut *mut redlock_mux_client,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(builder, "builder")?, Out::new(out, "out")?) };
        let client = handle.builder.clone().build()?;
        out.write(into_handle(redlock_mux_client { client }));
        Ok(())
    })
}

/// Frees a client. NULL is a no-op. Locks taken through it stay usable. Freeing the last
/// handle (the client, or the last lock taken through it) waits until every node has answered
/// what it was sent, for four node timeouts at most (200 ms if that is longer), so that a
/// release that returned at its quorum still reaches the slower nodes.
///
/// # Safety
/// `client` is NULL or a client not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_free(client: *mut redlock_mux_client) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(client) })
}

/// A lock handle of the C API: the lock it holds, until the lock is released or handed to
/// keep-alive. Every function on a handle goes through the generic helpers below.
trait Handle {
    /// What the handle holds: a guard, or a kept lock.
    type Lock: Held;
    /// The name of the handle's parameter, for the message when it is NULL.
    const ARG: &'static str = "lock";
    fn new(lock: Self::Lock) -> Self;
    fn slot(&self) -> &Option<Self::Lock>;
    fn slot_mut(&mut self) -> &mut Option<Self::Lock>;
    /// Runs before the lock is released (a kept lock silences its callback).
    fn before_release(&self) {}
}

/// The `Handle` of each guard handle: its lock lives in `held`.
macro_rules! guard_handles {
    ($($handle:ident: $lock:ty;)*) => {$(
        impl Handle for $handle {
            type Lock = $lock;
            fn new(lock: $lock) -> Self {
                $handle { held: Some(lock) }
            }
            fn slot(&self) -> &Option<$lock> {
                &self.held
            }
            fn slot_mut(&mut self) -> &mut Option<$lock> {
                &mut self.held
            }
        }
    )*};
}

guard_handles! {
    redlock_mux_lock: Lock;
    redlock_mux_read_lock: ReadLock;
    redlock_mux_write_lock: WriteLock;
    redlock_mux_multi_lock: MultiLock;
    redlock_mux_fenced_lock: FencedLock;
    redlock_mux_fenced_write_lock: FencedWriteLock;
    redlock_mux_permit: Permit;
}

impl Handle for redlock_mux_kept_lock {
    type Lock = KeptLock;
    const ARG: &'static str = "kept";
    fn new(lock: KeptLock) -> Self {
        redlock_mux_kept_lock {
            held: Some(lock),
            on_lost: None,
        }
    }
    fn slot(&self) -> &Option<KeptLock> {
        &self.held
    }
    fn slot_mut(&mut self) -> &mut Option<KeptLock> {
        &mut self.held
    }
    fn before_release(&self) {
        self.disarm();
    }
}

/// What the C API reads from, and does with, every kind of held lock: the guards of every
/// kind, and kept locks.
trait Held: Sized {
    fn validity(&self) -> Duration;
    fn token(&self) -> &[u8];
    fn release(self) -> Result<(), Error>;
}

impl<K: Kind> Held for Guard<K> {
    fn validity(&self) -> Duration {
        Guard::validity(self)
    }
    fn token(&self) -> &[u8] {
        Guard::token(self)
    }
    fn release(self) -> Result<(), Error> {
        Guard::release(self)
    }
}

impl Held for KeptLock {
    fn validity(&self) -> Duration {
        KeptLock::validity(self)
    }
    fn token(&self) -> &[u8] {
        KeptLock::token(self)
    }
    fn release(self) -> Result<(), Error> {
        KeptLock::release(self)
    }
}

fn released() -> Failure {
    Failure::new(
        REDLOCK_MUX_RELEASED,
        "the lock was already released, or handed to keep-alive; only free its handle",
    )
}

fn held<T>(slot: &Option<T>) -> Result<&T, Failure> {
    slot.as_ref().ok_or_else(released)
}

/// The shared body of every one-key acquisition: checks the arguments, runs `take`, hands
/// back the new handle.
///
/// # Safety
/// As for `redlock_mux_client_lock`.
unsafe fn acquire<H: Handle, E>(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut H,
    take: impl FnOnce(&Client, &[u8], Duration) -> Result<H::Lock, E>,
) -> redlock_mux_result
where
    Failure: From<E>,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, key, out) = unsafe {
            (
                arg_ref(client, "client")?,
                arg_key(key, key_len, "key")?,
                Out::new(out, "out")?,
            )
        };
        out.write(into_handle(H::new(take(
            &handle.client,
            key,
            millis(ttl_ms),
        )?)));
        Ok(())
    })
}

/// The body of every `_extend`.
///
/// # Safety
/// `lock` is NULL or a live handle used by no other thread.
unsafe fn extend<H, K>(lock: *mut H, ttl_ms: u64) -> redlock_mux_result
where
    H: Handle<Lock = Guard<K>>,
    K: Kind,
{
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { arg_mut(lock, H::ARG) }?;
        let guard = handle.slot_mut().as_mut().ok_or_else(released)?;
        guard.extend(millis(ttl_ms))?;
        Ok(())
    })
}

/// The body of every `_validity_ms`.
///
/// # Safety
/// `lock` is NULL or a live handle not being changed by another thread; `out_ms` is NULL or
/// writable.
unsafe fn validity<H: Handle>(lock: *const H, out_ms: *mut u64) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(lock, H::ARG)?, Out::new(out_ms, "out_ms")?) };
        let ms = held(handle.slot())?.validity().as_millis();
        out.write(u64::try_from(ms).unwrap_or(u64::MAX));
        Ok(())
    })
}

/// The body of every `_token`.
///
/// # Safety
/// `lock` is NULL or a live handle not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
unsafe fn token<H: Handle>(
    lock: *const H,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let handle = unsafe { arg_ref(lock, H::ARG) }?;
        if buf.is_null() {
            return Err(null("buf"));
        }
        // SAFETY: forwarded caller promise.
        let out_n = unsafe { Out::new(out_n, "out_n") }?;
        let token = held(handle.slot())?.token();
        if buf_len < token.len() {
            return Err(Failure::new(
                REDLOCK_MUX_BUFFER_TOO_SMALL,
                format!("the token is {} bytes, the buffer {buf_len}", token.len()),
            ));
        }
        // SAFETY: `buf` is non-NULL with room for `buf_len >= token.len()` bytes (caller's
        // promise), and cannot overlap the token, which is ours.
        unsafe { ptr::copy_nonoverlapping(token.as_ptr(), buf, token.len()) };
        out_n.write(token.len());
        Ok(())
    })
}

/// The body of every `_release`: afterwards the handle is empty, whatever the result.
///
/// # Safety
/// `lock` is NULL or a live handle used by no other thread.
unsafe fn release<H: Handle>(lock: *mut H) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { arg_mut(lock, H::ARG) }?;
        handle.before_release();
        handle.slot_mut().take().ok_or_else(released)?.release()?;
        Ok(())
    })
}

/// The body of every `_downgrade`: afterwards the write lock's handle is empty whatever the
/// result; on success the read lock is a new handle in `*out`.
///
/// # Safety
/// `lock` is NULL or a live handle used by no other thread; `out` is NULL or writable.
unsafe fn downgrade<H, K>(
    lock: *mut H,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result
where
    H: Handle<Lock = Guard<K>>,
    K: Writer,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_mut(lock, H::ARG)?, Out::new(out, "out")?) };
        let guard = handle.slot_mut().take().ok_or_else(released)?;
        let reader = match ttl_ms {
            0 => guard.downgrade(),
            ms => guard.downgrade_for(millis(ms)),
        }?;
        out.write(into_handle(redlock_mux_read_lock::new(reader)));
        Ok(())
    })
}

/// The locks on one resource key: guards of one-key kinds, and kept locks (whose key is a
/// set's first).
trait OneKeyed {
    fn key(&self) -> &[u8];
}

impl<K: OneKey> OneKeyed for Guard<K> {
    fn key(&self) -> &[u8] {
        Guard::key(self)
    }
}

impl OneKeyed for KeptLock {
    fn key(&self) -> &[u8] {
        KeptLock::key(self)
    }
}

/// The locks that may carry a fencing token: the fenced kinds' guards always do, a kept lock
/// does when it was fenced.
trait Fencing {
    fn fencing_token(&self) -> Option<u64>;
}

impl<K: Fenced> Fencing for Guard<K> {
    fn fencing_token(&self) -> Option<u64> {
        Some(Guard::fencing_token(self))
    }
}

impl Fencing for KeptLock {
    fn fencing_token(&self) -> Option<u64> {
        KeptLock::fencing_token(self)
    }
}

/// Writes a key the handle owns to the caller's two out slots.
fn write_key(out_key: Out<*const u8>, out_len: Out<usize>, key: &[u8]) {
    out_key.write(key.as_ptr());
    out_len.write(key.len());
}

/// The body of every `_key`.
///
/// # Safety
/// `lock` is NULL or a live handle not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
unsafe fn key<H>(lock: *const H, out_key: *mut *const u8, out_len: *mut usize) -> redlock_mux_result
where
    H: Handle,
    H::Lock: OneKeyed,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out_key, out_len) = unsafe {
            (
                arg_ref(lock, H::ARG)?,
                Out::new(out_key, "out_key")?,
                Out::new(out_len, "out_len")?,
            )
        };
        write_key(out_key, out_len, held(handle.slot())?.key());
        Ok(())
    })
}

/// The body of every `_fencing_token`.
///
/// # Safety
/// `lock` is NULL or a live handle not being changed by another thread; `out_token` is NULL
/// or writable.
unsafe fn fencing_token<H>(lock: *const H, out_token: *mut u64) -> redlock_mux_result
where
    H: Handle,
    H::Lock: Fencing,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(lock, H::ARG)?, Out::new(out_token, "out_token")?) };
        let token = held(handle.slot())?.fencing_token().ok_or_else(|| {
            Failure::new(
                REDLOCK_MUX_INVALID_ARGUMENT,
                "invalid argument: the lock is not a fenced one and has no fencing token",
            )
        })?;
        out.write(token);
        Ok(())
    })
}

/// A C callback and its user data, called at most once, from the keeper thread.
struct LostCallback {
    f: unsafe extern "C" fn(*mut c_void, redlock_mux_result),
    user_data: *mut c_void,
}

// SAFETY: `user_data` is only handed back to `f`, on the keeper thread; the caller of a
// `_keep_alive_with_callback` function promises that this is allowed.
unsafe impl Send for LostCallback {}

/// Where a kept lock's callback waits to be called; emptied when the handle is released or
/// freed, so that no call starts after that and none is still running when it returns.
type CallbackSlot = Arc<Mutex<Option<LostCallback>>>;

fn lock_slot(slot: &CallbackSlot) -> MutexGuard<'_, Option<LostCallback>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The body of every `_keep_alive`: hands the guard to the keeper thread, or, when the
/// settings are refused, leaves it in its handle.
///
/// # Safety
/// As for `redlock_mux_lock_keep_alive`.
unsafe fn keep_alive<H, K>(
    lock: *mut H,
    ttl_ms: u64,
    on_lost: Option<LostCallback>,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result
where
    H: Handle<Lock = Guard<K>>,
    K: Kind,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_mut(lock, H::ARG)?, Out::new(out, "out")?) };
        let guard = handle.slot_mut().take().ok_or_else(released)?;
        let mut settings = KeepAlive::new(millis(ttl_ms));
        let slot = on_lost.map(|callback| Arc::new(Mutex::new(Some(callback))));
        if let Some(slot) = &slot {
            let slot = Arc::clone(slot);
            settings = settings.on_lost(move |lost| {
                let callback = lock_slot(&slot);
                if let Some(c) = callback.as_ref() {
                    // SAFETY: the caller of the `_keep_alive_with_callback` function promises
                    // that `f` may be called with `user_data` from this thread.
                    unsafe { (c.f)(c.user_data, failure_code(&lost.error)) }
                }
            });
        }
        // Settings that cannot keep the lock are refused, and the lock stays where it was.
        let kept = match guard.keep_alive(settings) {
            Ok(kept) => kept,
            Err(refused) => {
                *handle.slot_mut() = Some(refused.guard);
                return Err(refused.error.into());
            }
        };
        let mut kept = redlock_mux_kept_lock::new(kept);
        kept.on_lost = slot;
        out.write(into_handle(kept));
        Ok(())
    })
}

/// The body of every `_keep_alive_with_callback`: `keep_alive` with a callback that must not
/// be NULL.
///
/// # Safety
/// As for `redlock_mux_lock_keep_alive_with_callback`.
unsafe fn keep_alive_calling<H, K>(
    lock: *mut H,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result
where
    H: Handle<Lock = Guard<K>>,
    K: Kind,
{
    let Some(f) = on_lost else {
        return boundary(|| Err(null("on_lost")));
    };
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, Some(LostCallback { f, user_data }), out) }
}

/// One attempt to take the mutex on the `key_len` bytes at `key` for `ttl_ms` milliseconds,
/// without retrying. On success writes a new lock to `*out`; `REDLOCK_MUX_CONTENDED` means
/// someone else holds it.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.try_lock(k, t)
        })
    }
}

/// Takes the mutex on the `key_len` bytes at `key` for `ttl_ms` milliseconds, waiting for it
/// as the client's retry count and wait timeout allow (a release by the holder wakes the
/// waiter at once). On success writes a new lock to `*out`. The lock is valid for
/// `redlock_mux_lock_validity_ms`, which is less than the TTL.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { acquire(client, key, key_len, ttl_ms, out, |c, k, t| c.lock(k, t)) }
}

/// Resets the lock's TTL to `ttl_ms` milliseconds on every node that still holds its token.
/// Succeeds only if a quorum agrees before the current validity ends. A failed extend never
/// lengthens the validity but may shorten it: nodes may have taken the new TTL (or take it
/// later), so the validity becomes the earlier of its current end and `ttl_ms` less the drift
/// allowance from the start of the attempt. A failed extend to a TTL longer than the validity
/// left leaves the lock as it was (held until its current validity ends, if it was held).
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_extend(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Writes to `*out_ms` the time left, in whole milliseconds, before the lock may be granted to
/// someone else; 0 once it has run out. Work that may take longer must extend the lock first.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_validity_ms(
    lock: *const redlock_mux_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Copies the lock's token (`REDLOCK_MUX_TOKEN_LEN` bytes of ASCII hex, no NUL: the value
/// stored at the key on every node that granted the lock) into `buf` and writes its length to
/// `*out_n`.
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
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a mutex, as it was given when the
/// lock was taken. The bytes belong to the handle: they stay valid, unchanged, until the lock
/// is released, handed to keep-alive, or freed, and must not be freed or written by the
/// caller.
///
/// # Safety
/// `lock` is NULL or a live lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_key(
    lock: *const redlock_mux_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Releases the lock on every node, and returns once a quorum has answered. Whatever the
/// result, the handle is released afterwards: further calls on it give `REDLOCK_MUX_RELEASED`,
/// and it must still be freed with `redlock_mux_lock_free`.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_release(
    lock: *mut redlock_mux_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Frees a lock handle. A lock still held is released first, best effort (call
/// `redlock_mux_lock_release` to learn whether that worked). NULL is a no-op.
///
/// # Safety
/// `lock` is NULL or a lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_free(lock: *mut redlock_mux_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// The functions of the other lock kinds below are written out rather than generated by a
// macro: cbindgen reads the source without expanding macros, so generated functions would be
// missing from the header. Each body is one call to a generic helper above.

/// One attempt to take the read lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds,
/// without retrying. The lock is shared: many readers may hold it at once, but no writer.
/// On success writes a new handle to `*out`; `REDLOCK_MUX_CONTENDED` means the other side
/// holds it.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_read_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.try_read_lock(k, t)
        })
    }
}

/// Takes the read lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds, waiting as the
/// client's retry count and wait timeout allow. The lock is shared:
/// many readers may hold it at once, but no writer. On success writes a new handle to `*out`.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_read_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.read_lock(k, t)
        })
    }
}

/// Like `redlock_mux_lock_extend`, for a read lock.
///
/// # Safety
/// `lock` is NULL or a live read lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_extend(
    lock: *mut redlock_mux_read_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a read lock.
///
/// # Safety
/// `lock` is NULL or a live read lock not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_validity_ms(
    lock: *const redlock_mux_read_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a read lock: this holder's token, `REDLOCK_MUX_TOKEN_LEN`
/// bytes of ASCII hex.
///
/// # Safety
/// `lock` is NULL or a live read lock not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_token(
    lock: *const redlock_mux_read_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a read lock, as it was given when the
/// lock was taken. The bytes belong to the handle: they stay valid, unchanged, until the lock
/// is released, handed to keep-alive, or freed, and must not be freed or written by the
/// caller.
///
/// # Safety
/// `lock` is NULL or a live read lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_key(
    lock: *const redlock_mux_read_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the lock in `lock`), for a read lock.
///
/// # Safety
/// `lock` is NULL or a live read lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_keep_alive(
    lock: *mut redlock_mux_read_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a read lock: `on_lost` is called
/// with `user_data` once, on the keeper thread, if the lock is lost.
///
/// # Safety
/// As for `redlock_mux_read_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_read_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Like `redlock_mux_lock_release`, for a read lock: afterwards the handle is released whatever
/// the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live read lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_release(
    lock: *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Frees a read lock handle, releasing it first, best effort, if it is still held. NULL is a
/// no-op.
///
/// # Safety
/// `lock` is NULL or a read lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_read_lock_free(lock: *mut redlock_mux_read_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

/// One attempt to take the write lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds,
/// without retrying. The lock is exclusive: no reader and no other writer may hold it.
/// On success writes a new handle to `*out`; `REDLOCK_MUX_CONTENDED` means the other side
/// holds it.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_write_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.try_write_lock(k, t)
        })
    }
}

/// Takes the write lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds, waiting as the
/// client's retry count and wait timeout allow. The lock is exclusive:
/// no reader and no other writer may hold it. On success writes a new handle to `*out`.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_write_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.write_lock(k, t)
        })
    }
}

/// Like `redlock_mux_lock_extend`, for a write lock.
///
/// # Safety
/// `lock` is NULL or a live write lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_extend(
    lock: *mut redlock_mux_write_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a write lock.
///
/// # Safety
/// `lock` is NULL or a live write lock not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_validity_ms(
    lock: *const redlock_mux_write_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a write lock: this holder's token, `REDLOCK_MUX_TOKEN_LEN`
/// bytes of ASCII hex.
///
/// # Safety
/// `lock` is NULL or a live write lock not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_token(
    lock: *const redlock_mux_write_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a write lock, as it was given when the
/// lock was taken. The bytes belong to the handle: they stay valid, unchanged, until the lock
/// is released, handed to keep-alive, or freed, and must not be freed or written by the
/// caller.
///
/// # Safety
/// `lock` is NULL or a live write lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_key(
    lock: *const redlock_mux_write_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the lock in `lock`), for a write lock.
///
/// # Safety
/// `lock` is NULL or a live write lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_keep_alive(
    lock: *mut redlock_mux_write_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a write lock: `on_lost` is called
/// with `user_data` once, on the keeper thread, if the lock is lost.
///
/// # Safety
/// As for `redlock_mux_write_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_write_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Like `redlock_mux_lock_release`, for a write lock: afterwards the handle is released whatever
/// the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live write lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_release(
    lock: *mut redlock_mux_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Turns a write lock into a read lock on the same resource without ever leaving it unlocked
/// (see `WriteLock::downgrade` in the Rust API): one round, atomic on each node, that adds our
/// reader and then drops our writer key. Other readers may join at once; no writer gets in
/// between. `ttl_ms` is the read lock's TTL; 0 keeps the TTL the lock was taken (or last
/// extended) with.
///
/// On success writes a new read lock to `*out`, with the same token; free it with
/// `redlock_mux_read_lock_free`. Whatever the result, the write lock's handle is empty
/// afterwards and must still be freed. On failure (`REDLOCK_MUX_CONTENDED`: the write lock
/// was lost on too many nodes; `REDLOCK_MUX_QUORUM_UNREACHABLE`; an expired validity; an
/// invalid TTL) the round was undone on every node and **nothing is held**: neither the write
/// lock nor a read lock. There is no upgrade (read to write): two readers upgrading at once
/// would wait for each other.
///
/// # Safety
/// `lock` is NULL or a live write lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_downgrade(
    lock: *mut redlock_mux_write_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { downgrade(lock, ttl_ms, out) }
}

/// Frees a write lock handle, releasing it first, best effort, if it is still held. NULL is a
/// no-op.
///
/// # Safety
/// `lock` is NULL or a write lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_write_lock_free(lock: *mut redlock_mux_write_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// All-or-none locks over a set of keys.

/// The `count` keys at `keys`, with their lengths at `key_lens`: checked for NULL (the arrays
/// even when `count` is 0, and every key), and for a count over the cap before either array is
/// read.
///
/// # Safety
/// `keys` and `key_lens` are NULL or point to `count` readable elements; each `keys[i]` is NULL
/// or points to `key_lens[i]` readable bytes; all unchanged for `'a`.
unsafe fn arg_keys<'a>(
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
) -> Result<Vec<&'a [u8]>, Failure> {
    if keys.is_null() {
        return Err(null("keys"));
    }
    if key_lens.is_null() {
        return Err(null("key_lens"));
    }
    if count > MAX_LOCK_ALL_KEYS {
        return Err(InvalidArgument::TooManyKeys {
            count,
            max: MAX_LOCK_ALL_KEYS,
        }
        .into());
    }
    // SAFETY: both non-NULL with `count <= MAX_LOCK_ALL_KEYS` readable elements (caller's
    // promise), so neither slice can be too long.
    let (ptrs, lens) = unsafe {
        (
            std::slice::from_raw_parts(keys, count),
            std::slice::from_raw_parts(key_lens, count),
        )
    };
    ptrs.iter()
        .zip(lens)
        .enumerate()
        // SAFETY: forwarded caller promise, key by key.
        .map(|(i, (&p, &len))| unsafe { arg_key(p, len, &format!("keys[{i}]")) })
        .collect()
}

/// The shared body of every all-or-none acquisition: checks the arguments, runs `take`, hands
/// back the new handle.
///
/// # Safety
/// As for `redlock_mux_client_lock_all`.
unsafe fn acquire_all<E>(
    client: *const redlock_mux_client,
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_multi_lock,
    take: impl FnOnce(&Client, Vec<&[u8]>, Duration) -> Result<MultiLock, E>,
) -> redlock_mux_result
where
    Failure: From<E>,
{
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, keys, out) = unsafe {
            (
                arg_ref(client, "client")?,
                arg_keys(keys, key_lens, count)?,
                Out::new(out, "out")?,
            )
        };
        let lock = take(&handle.client, keys, millis(ttl_ms))?;
        out.write(into_handle(redlock_mux_multi_lock::new(lock)));
        Ok(())
    })
}

/// One attempt to lock every one of `count` keys for `ttl_ms` milliseconds, or none of them,
/// without retrying. Key `i` is the `key_lens[i]` bytes at `keys[i]`. On success writes a new
/// handle to `*out`; `REDLOCK_MUX_CONTENDED` means some key of the set is held elsewhere, and
/// then none was taken.
///
/// `REDLOCK_MUX_INVALID_ARGUMENT`, before anything is sent: no keys, more than
/// `REDLOCK_MUX_MAX_LOCK_ALL_KEYS`, an empty or too long key, the same key twice.
///
/// # Safety
/// `client` is NULL or a live client; `keys` and `key_lens` are NULL or point to `count`
/// readable elements; each `keys[i]` is NULL or points to `key_lens[i]` readable bytes; `out`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_lock_all(
    client: *const redlock_mux_client,
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_multi_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire_all(client, keys, key_lens, count, ttl_ms, out, |c, k, t| {
            c.try_lock_all(k, t)
        })
    }
}

/// Locks every one of `count` keys for `ttl_ms` milliseconds, or none of them, waiting as the
/// client's retry count and wait timeout allow (the release of any key of the set wakes the
/// waiter). Each node takes the whole set in one atomic step or none of it; the set is held
/// when a quorum took all of it. A set and a mutex on one of its keys exclude each other. On
/// success writes a new handle to `*out`. Arguments as for `redlock_mux_client_try_lock_all`.
///
/// # Safety
/// As for `redlock_mux_client_try_lock_all`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock_all(
    client: *const redlock_mux_client,
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_multi_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire_all(client, keys, key_lens, count, ttl_ms, out, |c, k, t| {
            c.lock_all(k, t)
        })
    }
}

/// Like `redlock_mux_lock_extend`, for a set: resets the TTL of every key on every node that
/// still holds the whole set with this token.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_extend(
    lock: *mut redlock_mux_multi_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a set: the time left before any of its keys may be
/// granted to someone else.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock not being changed by another thread; `out_ms` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_validity_ms(
    lock: *const redlock_mux_multi_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a set: the token stored at every key of the set,
/// `REDLOCK_MUX_TOKEN_LEN` bytes of ASCII hex.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock not being changed by another thread; `buf` is NULL
/// or points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_token(
    lock: *const redlock_mux_multi_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_count` the number of keys in the set.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock not being changed by another thread; `out_count` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_key_count(
    lock: *const redlock_mux_multi_lock,
    out_count: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(lock, "lock")?, Out::new(out_count, "out_count")?) };
        out.write(held(&handle.held)?.keys().len());
        Ok(())
    })
}

/// Writes to `*out_key` and `*out_len` the key at `index` of the set, in sorted order (bytewise,
/// shorter first on a common prefix), so that index 0 is the smallest. The bytes belong to the
/// handle: they stay valid, unchanged, until the lock is released, handed to keep-alive, or
/// freed, and must not be freed or written by the caller. An `index` not below the key count gives
/// `REDLOCK_MUX_INVALID_ARGUMENT`.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_key(
    lock: *const redlock_mux_multi_lock,
    index: usize,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out_key, out_len) = unsafe {
            (
                arg_ref(lock, "lock")?,
                Out::new(out_key, "out_key")?,
                Out::new(out_len, "out_len")?,
            )
        };
        let mut keys = held(&handle.held)?.keys();
        let count = keys.len();
        let key = keys.nth(index).ok_or_else(|| {
            Failure::new(
                REDLOCK_MUX_INVALID_ARGUMENT,
                format!("invalid argument: key index {index}, but the set has {count} keys"),
            )
        })?;
        write_key(out_key, out_len, key);
        Ok(())
    })
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the lock in `lock`), for a set. Each extension
/// extends the whole set; a node that lost any key of it refuses, and the set is lost when a
/// quorum refuses. `redlock_mux_kept_lock_key` then gives the set's first key.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_keep_alive(
    lock: *mut redlock_mux_multi_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a set: `on_lost` is called
/// with `user_data` once, on the keeper thread, if the lock is lost.
///
/// # Safety
/// As for `redlock_mux_multi_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_multi_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Like `redlock_mux_lock_release`, for a set: releases every key still holding this token, on
/// every node. Afterwards the handle is released whatever the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live multi-key lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_release(
    lock: *mut redlock_mux_multi_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Frees a multi-key lock handle, releasing the set first, best effort, if it is still held.
/// NULL is a no-op.
///
/// # Safety
/// `lock` is NULL or a multi-key lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_multi_lock_free(lock: *mut redlock_mux_multi_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// Fenced mutexes.

/// One attempt to take the mutex on the `key_len` bytes at `key` for `ttl_ms` milliseconds
/// with a fencing token, without retrying. On success writes a new handle to `*out`;
/// `REDLOCK_MUX_CONTENDED` means someone else holds it. A fenced lock and a plain one on the
/// same key exclude each other.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_lock_fenced(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_fenced_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.try_lock_fenced(k, t)
        })
    }
}

/// Takes the mutex on the `key_len` bytes at `key` for `ttl_ms` milliseconds with a fencing
/// token, waiting as the client's retry count and wait timeout allow. Costs one more round
/// trip than `redlock_mux_client_lock` when the nodes' counters disagree. On success writes a
/// new handle to `*out`.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock_fenced(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_fenced_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.lock_fenced(k, t)
        })
    }
}

/// Writes the lock's fencing token to `*out_token`: larger than that of every fenced grant of
/// the same key that held it before, smaller than that of every one after (across all
/// clients; not consecutive). Send it with every write to the protected store, which keeps the
/// largest it has seen and refuses smaller ones. Extending keeps it. Tokens hold only while
/// every node keeps its counter through a crash (AOF with `appendfsync always`).
///
/// # Safety
/// `lock` is NULL or a live fenced lock not being changed by another thread; `out_token` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_fencing_token(
    lock: *const redlock_mux_fenced_lock,
    out_token: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { fencing_token(lock, out_token) }
}

/// Like `redlock_mux_lock_extend`, for a fenced lock. The fencing token stays the same.
///
/// # Safety
/// `lock` is NULL or a live fenced lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_extend(
    lock: *mut redlock_mux_fenced_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a fenced lock.
///
/// # Safety
/// `lock` is NULL or a live fenced lock not being changed by another thread; `out_ms` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_validity_ms(
    lock: *const redlock_mux_fenced_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a fenced lock: the random token stored at the key
/// (`REDLOCK_MUX_TOKEN_LEN` bytes of ASCII hex), not the fencing token.
///
/// # Safety
/// `lock` is NULL or a live fenced lock not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_token(
    lock: *const redlock_mux_fenced_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a fenced lock, as it was given when the
/// lock was taken. The bytes belong to the handle: they stay valid, unchanged, until the lock
/// is released, handed to keep-alive, or freed, and must not be freed or written by the
/// caller.
///
/// # Safety
/// `lock` is NULL or a live fenced lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_key(
    lock: *const redlock_mux_fenced_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the lock in `lock`), for a fenced lock. The kept
/// lock keeps the fencing token: `redlock_mux_kept_lock_fencing_token`.
///
/// # Safety
/// `lock` is NULL or a live fenced lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_keep_alive(
    lock: *mut redlock_mux_fenced_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a fenced lock: `on_lost` is called
/// with `user_data` once, on the keeper thread, if the lock is lost.
///
/// # Safety
/// As for `redlock_mux_fenced_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_fenced_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Like `redlock_mux_lock_release`, for a fenced lock (the nodes' counters stay): afterwards
/// the handle is released whatever the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live fenced lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_release(
    lock: *mut redlock_mux_fenced_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Frees a fenced lock handle, releasing it first, best effort, if it is still held. NULL is a
/// no-op.
///
/// # Safety
/// `lock` is NULL or a fenced lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_lock_free(lock: *mut redlock_mux_fenced_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// Fenced write locks.

/// One attempt to take the write lock on the `key_len` bytes at `key` for `ttl_ms`
/// milliseconds with a fencing token, without retrying. On success writes a new handle to
/// `*out`; `REDLOCK_MUX_CONTENDED` means readers or a writer hold it. A fenced write lock
/// excludes readers and writers, fenced or not, as a plain write lock does.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_write_lock_fenced(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_fenced_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.try_write_lock_fenced(k, t)
        })
    }
}

/// Takes the write lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds with a
/// fencing token, waiting as the client's retry count and wait timeout allow. The token is
/// read in the acquire round, and written back to a quorum (one more round trip) only when the
/// nodes' counters disagree. On success writes a new handle to `*out`.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_write_lock_fenced(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_fenced_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.write_lock_fenced(k, t)
        })
    }
}

/// Like `redlock_mux_fenced_lock_fencing_token`, for a fenced write lock: larger than that of
/// every fenced write grant of the same resource before it, smaller than that of every one
/// after. The counter is the write lock's own: fenced mutexes on the same key count apart.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock not being changed by another thread;
/// `out_token` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_fencing_token(
    lock: *const redlock_mux_fenced_write_lock,
    out_token: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { fencing_token(lock, out_token) }
}

/// Like `redlock_mux_lock_extend`, for a fenced write lock. The fencing token stays the same.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_extend(
    lock: *mut redlock_mux_fenced_write_lock,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a fenced write lock.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock not being changed by another thread; `out_ms`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_validity_ms(
    lock: *const redlock_mux_fenced_write_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a fenced write lock: the random token stored at the
/// writer key (`REDLOCK_MUX_TOKEN_LEN` bytes of ASCII hex), not the fencing token.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock not being changed by another thread; `buf` is
/// NULL or points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_token(
    lock: *const redlock_mux_fenced_write_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a fenced write lock, as it was
/// given when the lock was taken. The bytes belong to the handle: they stay valid, unchanged,
/// until the lock is released, handed to keep-alive, or freed, and must not be freed or
/// written by the caller.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock not being changed by another thread; `out_key`
/// and `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_key(
    lock: *const redlock_mux_fenced_write_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the lock in `lock`), for a fenced write lock. The kept
/// lock keeps the fencing token: `redlock_mux_kept_lock_fencing_token`.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_keep_alive(
    lock: *mut redlock_mux_fenced_write_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a fenced write lock: `on_lost` is called
/// with `user_data` once, on the keeper thread, if the lock is lost.
///
/// # Safety
/// As for `redlock_mux_fenced_write_lock_keep_alive`; `on_lost` is NULL or a function that
/// may be called, from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_fenced_write_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}
/// Like `redlock_mux_lock_release`, for a fenced write lock (the nodes' counters stay):
/// afterwards the handle is released whatever the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live fenced write lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_release(
    lock: *mut redlock_mux_fenced_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Like `redlock_mux_write_lock_downgrade`, for a write lock with a fencing token (the read
/// lock has none).
///
/// # Safety
/// `lock` is NULL or a live fenced write lock used by no other thread; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_downgrade(
    lock: *mut redlock_mux_fenced_write_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { downgrade(lock, ttl_ms, out) }
}

/// Frees a fenced write lock handle, releasing it first, best effort, if it is still held.
/// NULL is a no-op.
///
/// # Safety
/// `lock` is NULL or a fenced write lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_fenced_write_lock_free(
    lock: *mut redlock_mux_fenced_write_lock,
) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// Counting semaphores.

/// Writes to `*out_quorum` how many nodes must admit a holder of a semaphore of `permits`
/// permits over this client's N nodes: the smallest quorum that makes `permits + 1` holders
/// impossible, `floor(permits * N / (permits + 1)) + 1` (the Redlock majority for 1 permit).
/// Acquires stop once more than `N - quorum` nodes are down. `REDLOCK_MUX_INVALID_ARGUMENT`
/// for 0 permits or more than the library allows.
///
/// # Safety
/// `client` is NULL or a live client; `out_quorum` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_semaphore_quorum(
    client: *const redlock_mux_client,
    permits: u32,
    out_quorum: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe {
            (
                arg_ref(client, "client")?,
                Out::new(out_quorum, "out_quorum")?,
            )
        };
        out.write(handle.client.semaphore("q", permits)?.quorum());
        Ok(())
    })
}

/// One attempt to take one of the `permits` permits of the semaphore on the `key_len` bytes
/// at `key` for `ttl_ms` milliseconds, without retrying. At most `permits` holders hold a
/// permit at once, over a quorum of `redlock_mux_semaphore_quorum` nodes. On success writes a
/// new handle to `*out`; `REDLOCK_MUX_CONTENDED` means every permit is taken;
/// `REDLOCK_MUX_INVALID_ARGUMENT` for 0 permits; `REDLOCK_MUX_CONFIG` when the nodes' semaphore
/// on the key was created with another number of permits.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_try_acquire_permit(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_permit,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.semaphore(k, permits)?.try_acquire(t)
        })
    }
}

/// Like `redlock_mux_client_try_acquire_permit`, waiting as the client's retry count and wait
/// timeout allow; a release of a permit wakes the waiters at once.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_acquire_permit(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_permit,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            c.semaphore(k, permits)?.acquire(t)
        })
    }
}

/// Writes to `*out_available` an estimate of the free permits of the semaphore of `permits`
/// permits on the `key_len` bytes at `key`, for monitoring: how many acquisitions would win
/// one after the other if nothing else changed (a node that does not answer counts as full).
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out_available` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_semaphore_available(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    out_available: *mut u32,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, key, out) = unsafe {
            (
                arg_ref(client, "client")?,
                arg_key(key, key_len, "key")?,
                Out::new(out_available, "out_available")?,
            )
        };
        out.write(handle.client.semaphore(key, permits)?.available()?);
        Ok(())
    })
}

/// Like `redlock_mux_lock_extend`, for a permit: succeeds only if a quorum of nodes still
/// admits it.
///
/// # Safety
/// `lock` is NULL or a live permit used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_extend(
    lock: *mut redlock_mux_permit,
    ttl_ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { extend(lock, ttl_ms) }
}

/// Like `redlock_mux_lock_validity_ms`, for a permit.
///
/// # Safety
/// `lock` is NULL or a live permit not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_validity_ms(
    lock: *const redlock_mux_permit,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(lock, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a permit: this holder's token, `REDLOCK_MUX_TOKEN_LEN`
/// bytes of ASCII hex.
///
/// # Safety
/// `lock` is NULL or a live permit not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_token(
    lock: *const redlock_mux_permit,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(lock, buf, buf_len, out_n) }
}

/// Like `redlock_mux_read_lock_key`, for a permit: the semaphore's resource key.
///
/// # Safety
/// `lock` is NULL or a live permit not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_key(
    lock: *const redlock_mux_permit,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(lock, out_key, out_len) }
}

/// Like `redlock_mux_lock_keep_alive` (the same ownership rules, and the same refusals, which
/// leave the permit in `lock`), for a permit.
///
/// # Safety
/// `lock` is NULL or a live permit used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_keep_alive(
    lock: *mut redlock_mux_permit,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Like `redlock_mux_lock_keep_alive_with_callback`, for a permit: `on_lost` is called with
/// `user_data` once, on the keeper thread, if the permit is lost.
///
/// # Safety
/// As for `redlock_mux_permit_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_keep_alive_with_callback(
    lock: *mut redlock_mux_permit,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Like `redlock_mux_lock_release`, for a permit: the permit is given back and waiters are
/// woken; afterwards the handle is released whatever the result, and must still be freed.
///
/// # Safety
/// `lock` is NULL or a live permit used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_release(
    lock: *mut redlock_mux_permit,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(lock) }
}

/// Frees a permit handle, releasing it first, best effort, if it is still held. NULL is a
/// no-op.
///
/// # Safety
/// `lock` is NULL or a permit not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_permit_free(lock: *mut redlock_mux_permit) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(lock) })
}

// Kept locks: locks of any kind, extended by the client's keeper thread.

/// Hands the mutex held by `lock` to the client's keeper thread, which extends it to `ttl_ms`
/// milliseconds every `ttl_ms / 3`, and sooner when the validity left runs low, until the kept
/// lock is released or freed, or the lock is lost. On success writes a new kept lock to `*out`.
/// A `ttl_ms` that cannot keep the lock (one the client refuses, or one too close to the drift
/// allowance for `ttl_ms / 3` to be less than the validity it gives) is refused with
/// `REDLOCK_MUX_INVALID_ARGUMENT`.
///
/// Ownership: on success the lock moves from `lock` into the kept lock. `lock` is left empty:
/// every call on it gives `REDLOCK_MUX_RELEASED`, and it must still be freed with
/// `redlock_mux_lock_free`, which then releases nothing. The kept lock is freed with
/// `redlock_mux_kept_lock_free`, which releases the lock. On failure nothing moves: `lock`
/// holds the lock as before.
///
/// A lost lock (an extension refused by the quorum, or no extension won before the validity
/// ran out) is reported by `redlock_mux_kept_lock_is_lost`; poll it before each step that
/// needs the lock.
///
/// The keeper thread starts with the client's first kept lock, and ends on its own, within one
/// extension interval, once the client and every lock taken through it have been freed.
///
/// # Safety
/// `lock` is NULL or a live lock used by no other thread; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_keep_alive(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive(lock, ttl_ms, None, out) }
}

/// Called when a kept lock is lost, with the `user_data` given to its
/// `_keep_alive_with_callback` function (such as `redlock_mux_lock_keep_alive_with_callback`)
/// and why: `REDLOCK_MUX_CONTENDED` when the
/// quorum refused an extension (the key expired, or holds someone else's token),
/// `REDLOCK_MUX_VALIDITY_EXPIRED` when no extension won before the validity ran out.
pub type redlock_mux_lost_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, reason: redlock_mux_result)>;

/// Like `redlock_mux_lock_keep_alive` (same ownership rules), and `on_lost(user_data, reason)`
/// is called once if the lock is lost. `user_data` is passed through untouched and may be NULL.
///
/// The callback runs on the client's keeper thread (one thread extends every kept lock of the
/// client), never on the caller's, and not at all once the kept lock has been released or
/// freed: `redlock_mux_kept_lock_release` and `redlock_mux_kept_lock_free` wait for a call in
/// progress to return, so `user_data` may be freed as soon as either returns. So the callback
/// must be quick, must be safe to run on another thread (use atomics or a mutex to hand
/// anything over), must not release or free the kept lock it reports (that would wait for
/// itself), and must not wait for a thread that may be releasing or freeing it.
///
/// # Safety
/// As for `redlock_mux_lock_keep_alive`; `on_lost` is NULL or a function that may be called,
/// from another thread, with `user_data`, until the kept lock is released or freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_lock_keep_alive_with_callback(
    lock: *mut redlock_mux_lock,
    ttl_ms: u64,
    on_lost: redlock_mux_lost_callback,
    user_data: *mut c_void,
    out: *mut *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { keep_alive_calling(lock, ttl_ms, on_lost, user_data, out) }
}

/// Writes to `*out_lost` 1 if the kept lock was lost (an extension was refused by the quorum,
/// or no extension won before the validity ran out), 0 while it is held. Once lost, always
/// lost: stop work that needs the lock.
///
/// # Safety
/// `kept` is NULL or a live kept lock not being changed by another thread; `out_lost` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_is_lost(
    kept: *const redlock_mux_kept_lock,
    out_lost: *mut u8,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(kept, "kept")?, Out::new(out_lost, "out_lost")?) };
        out.write(u8::from(held(&handle.held)?.is_lost()));
        Ok(())
    })
}

/// Like `redlock_mux_lock_validity_ms`, for a kept lock: the time left as of the last extension
/// that won; 0 once lost. May wait while an extension is in flight, at most the node timeout.
///
/// # Safety
/// `kept` is NULL or a live kept lock not being changed by another thread; `out_ms` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_validity_ms(
    kept: *const redlock_mux_kept_lock,
    out_ms: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { validity(kept, out_ms) }
}

/// Like `redlock_mux_lock_token`, for a kept lock: the token it had before it was kept.
///
/// # Safety
/// `kept` is NULL or a live kept lock not being changed by another thread; `buf` is NULL or
/// points to `buf_len` writable bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_token(
    kept: *const redlock_mux_kept_lock,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { token(kept, buf, buf_len, out_n) }
}

/// Writes to `*out_key` and `*out_len` the resource key of a kept lock (for a set, its first
/// key in sorted order). The bytes belong to the handle: they stay valid, unchanged, until
/// the kept lock is released or freed, and must not be freed or written by the caller.
///
/// # Safety
/// `kept` is NULL or a live kept lock not being changed by another thread; `out_key` and
/// `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_key(
    kept: *const redlock_mux_kept_lock,
    out_key: *mut *const u8,
    out_len: *mut usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { key(kept, out_key, out_len) }
}

/// Writes to `*out_token` the fencing token of a kept fenced lock or fenced write lock: the
/// one it was granted, which extensions keep. A kept lock of a kind without fencing tokens
/// gives `REDLOCK_MUX_INVALID_ARGUMENT`.
///
/// # Safety
/// `kept` is NULL or a live kept lock not being changed by another thread; `out_token` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_fencing_token(
    kept: *const redlock_mux_kept_lock,
    out_token: *mut u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe { fencing_token(kept, out_token) }
}

/// Stops the extensions and releases the lock on every node (a lost lock too, in case some
/// node still holds its token). No lost-lock callback runs after this returns. Afterwards the
/// handle is released whatever the result, and must still be freed.
///
/// # Safety
/// `kept` is NULL or a live kept lock used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_release(
    kept: *mut redlock_mux_kept_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { release(kept) }
}

/// Frees a kept lock handle: stops the extensions and, if the lock is still held, releases it,
/// best effort. No lost-lock callback runs after this returns. NULL is a no-op.
///
/// # Safety
/// `kept` is NULL or a kept lock not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_kept_lock_free(kept: *mut redlock_mux_kept_lock) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(kept) })
}

// Cancellation, per-call options, resume and statistics.

/// Cancels waiting acquisitions, from any thread. Made by `redlock_mux_cancel_new`, freed by
/// `redlock_mux_cancel_free`. Given to calls through `redlock_mux_acquire_options.cancel`.
pub struct redlock_mux_cancel {
    cancel: Cancel,
}

/// `redlock_mux_acquire_options.set`: `timeout_ms` replaces the client's wait timeout.
pub const REDLOCK_MUX_ACQUIRE_TIMEOUT: u32 = 1;
/// `redlock_mux_acquire_options.set`: `retries` replaces the client's retry count.
pub const REDLOCK_MUX_ACQUIRE_RETRIES: u32 = 2;

/// How one waiting acquisition (a `_with` function) waits, in place of the client's settings.
/// A zeroed struct (`redlock_mux_acquire_options opts = {0};`) keeps every client setting and
/// has no cancel handle.
#[repr(C)]
pub struct redlock_mux_acquire_options {
    /// Which of `timeout_ms` and `retries` are given: `REDLOCK_MUX_ACQUIRE_TIMEOUT` and
    /// `REDLOCK_MUX_ACQUIRE_RETRIES`, or'ed; the others keep the client's setting. Any other
    /// bit gives `REDLOCK_MUX_INVALID_ARGUMENT`.
    pub set: u32,
    /// How many retries may follow a retry delay in which no release was announced;
    /// `UINT32_MAX` means no limit.
    pub retries: u32,
    /// The longest the call waits in all, in milliseconds: no attempt starts after it. 0 makes
    /// one attempt; at most a day. A deadline shared by several calls is the time left to it,
    /// computed by the caller before each call.
    pub timeout_ms: u64,
    /// NULL, or a cancel handle: `redlock_mux_cancel_cancel` ends the call with
    /// `REDLOCK_MUX_CANCELLED`. The handle must stay alive until the call has read it (it may
    /// be freed once the call has returned).
    pub cancel: *const redlock_mux_cancel,
}

/// How the acquisition rounds of one lock kind ended.
#[repr(C)]
pub struct redlock_mux_round_stats {
    /// Won on a quorum within the validity.
    pub won: u64,
    /// Lost because the lock was held elsewhere.
    pub contended: u64,
    /// Lost for any other reason (too many nodes failed, the validity ran out, misconfigured
    /// nodes).
    pub unreachable: u64,
}

/// What a client's locks have been doing since it was built: `redlock_mux_client_stats`.
#[repr(C)]
pub struct redlock_mux_stats {
    /// Acquisition rounds of mutexes.
    pub mutex: redlock_mux_round_stats,
    /// Acquisition rounds of read locks.
    pub read: redlock_mux_round_stats,
    /// Acquisition rounds of write locks.
    pub write: redlock_mux_round_stats,
    /// Acquisition rounds of all-or-none locks.
    pub all: redlock_mux_round_stats,
    /// Acquisition rounds of fenced mutexes.
    pub fenced_mutex: redlock_mux_round_stats,
    /// Acquisition rounds of fenced write locks.
    pub fenced_write: redlock_mux_round_stats,
    /// Acquisition rounds of semaphore permits.
    pub semaphore: redlock_mux_round_stats,
    /// Release announcements that woke a waiter for a retry.
    pub wakeups: u64,
    /// Attempts after an acquisition's first.
    pub retries: u64,
    /// Acquisitions that ended with `REDLOCK_MUX_CANCELLED`.
    pub cancellations: u64,
    /// How many nodes the client has: `redlock_mux_client_node_stats` takes 0 to
    /// `node_count - 1`.
    pub node_count: usize,
}

/// One node's failures and reply latency: `redlock_mux_client_node_stats`.
#[repr(C)]
pub struct redlock_mux_node_stats {
    /// Failures in rounds (acquire, extend, release): no reply within the node timeout.
    pub timeout_failures: u64,
    /// ... the connection could not be made.
    pub connect_failures: u64,
    /// ... the node failed recently and was skipped during its reconnect backoff.
    pub backoff_failures: u64,
    /// ... the connection broke.
    pub io_failures: u64,
    /// ... the node sent bytes that are not valid RESP2.
    pub protocol_failures: u64,
    /// ... an error reply from the server.
    pub server_failures: u64,
    /// ... a well-formed reply that was not one of the expected ones.
    pub unexpected_reply_failures: u64,
    /// ... the node refused the connection setup (AUTH, SELECT).
    pub setup_failures: u64,
    /// How many of the node's latest replies the percentiles are taken over (at most 128);
    /// 0 before any reply, and then both percentiles are 0.
    pub latency_samples: u64,
    /// The median time from a round's start to this node's reply, in microseconds.
    pub latency_p50_us: u64,
    /// The 99th percentile of the same, in microseconds.
    pub latency_p99_us: u64,
}

/// Makes a cancel handle, not cancelled yet, and writes it to `*out`. Free it with
/// `redlock_mux_cancel_free`. One handle may be given to many calls, on many threads.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_cancel_new(
    out: *mut *mut redlock_mux_cancel,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let out = unsafe { Out::new(out, "out")? };
        out.write(into_handle(redlock_mux_cancel {
            cancel: Cancel::new(),
        }));
        Ok(())
    })
}

/// Cancels every waiting acquisition given this handle, now and later: each returns
/// `REDLOCK_MUX_CANCELLED` at once, wherever it is (before its first attempt, with an attempt
/// in flight, parked waiting for a release or a retry, in a fair queue), and what it had on
/// the nodes is undone. A call that already won keeps its lock. Returns at once. May be called
/// from any thread, while other threads wait with the handle.
///
/// # Safety
/// `cancel` is NULL or a live cancel handle.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_cancel_cancel(
    cancel: *const redlock_mux_cancel,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        unsafe { arg_ref(cancel, "cancel")? }.cancel.cancel();
        Ok(())
    })
}

/// Writes 1 to `*out` if `redlock_mux_cancel_cancel` was called on the handle, else 0.
///
/// # Safety
/// `cancel` is NULL or a live cancel handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_cancel_is_cancelled(
    cancel: *const redlock_mux_cancel,
    out: *mut u8,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (cancel, out) = unsafe { (arg_ref(cancel, "cancel")?, Out::new(out, "out")?) };
        out.write(u8::from(cancel.cancel.is_cancelled()));
        Ok(())
    })
}

/// Frees a cancel handle. NULL is a no-op. Calls that were given it and have returned are not
/// affected; free it only once no call that was given it is still starting.
///
/// # Safety
/// `cancel` is NULL or a cancel handle not yet freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_cancel_free(cancel: *mut redlock_mux_cancel) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(cancel) })
}

/// The options at `options`, checked, as the Rust API takes them.
///
/// # Safety
/// `options` is NULL or points to a readable struct whose `cancel` is NULL or a live handle.
unsafe fn arg_options(options: *const redlock_mux_acquire_options) -> Result<Acquire, Failure> {
    // SAFETY: forwarded caller promise.
    let o = unsafe { arg_ref(options, "options")? };
    let known = REDLOCK_MUX_ACQUIRE_TIMEOUT | REDLOCK_MUX_ACQUIRE_RETRIES;
    if o.set & !known != 0 {
        return Err(Failure::new(
            REDLOCK_MUX_INVALID_ARGUMENT,
            format!(
                "invalid argument: `options.set` has unknown bits {:#x}",
                o.set & !known
            ),
        ));
    }
    let mut acquire = Acquire::new();
    if o.set & REDLOCK_MUX_ACQUIRE_TIMEOUT != 0 {
        acquire = acquire.timeout(millis(o.timeout_ms));
    }
    if o.set & REDLOCK_MUX_ACQUIRE_RETRIES != 0 {
        acquire = acquire.retries(o.retries);
    }
    // SAFETY: forwarded caller promise; NULL means no handle.
    if let Some(cancel) = unsafe { o.cancel.as_ref() } {
        acquire = acquire.cancel(&cancel.cancel);
    }
    Ok(acquire)
}

/// Runs a `_with` call's `f` with the options at `options`.
///
/// # Safety
/// As for `arg_options`.
unsafe fn with_options<L>(
    options: *const redlock_mux_acquire_options,
    f: impl FnOnce(&Acquire) -> Result<L, Error>,
) -> Result<L, Failure> {
    // SAFETY: forwarded caller promise.
    let options = unsafe { arg_options(options)? };
    Ok(f(&options)?)
}

/// Runs a `_resume` call's `f` with the `token_len` bytes at `token`.
///
/// # Safety
/// `token` is NULL or points to `token_len` readable bytes.
unsafe fn with_token<L>(
    token: *const u8,
    token_len: usize,
    f: impl FnOnce(&[u8]) -> Result<L, Error>,
) -> Result<L, Failure> {
    // SAFETY: forwarded caller promise.
    let token = unsafe { arg_bytes(token, token_len, "token")? };
    Ok(f(token)?)
}

/// `redlock_mux_client_lock`, waiting as `*options` says: its timeout, its retry count and its
/// cancel handle, in place of the client's settings. `REDLOCK_MUX_CANCELLED` when the handle
/// was cancelled before the lock was won; a wait that ends reports its last attempt, as
/// `redlock_mux_client_lock` does. `options` must not be NULL.
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `options` is NULL or readable, its `cancel` NULL or a live handle; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.lock_with(k, t, o))
        })
    }
}

/// `redlock_mux_client_read_lock`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_with`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_read_lock_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.read_lock_with(k, t, o))
        })
    }
}

/// `redlock_mux_client_write_lock`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_with`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_write_lock_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.write_lock_with(k, t, o))
        })
    }
}

/// `redlock_mux_client_lock_all`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_all`; `options` is NULL or readable, its `cancel` NULL or a
/// live handle.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock_all_with(
    client: *const redlock_mux_client,
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_multi_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire_all(client, keys, key_lens, count, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.lock_all_with(k, t, o))
        })
    }
}

/// `redlock_mux_client_lock_fenced`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_with`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_lock_fenced_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_fenced_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.lock_fenced_with(k, t, o))
        })
    }
}

/// `redlock_mux_client_write_lock_fenced`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_with`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_write_lock_fenced_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_fenced_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.write_lock_fenced_with(k, t, o))
        })
    }
}

/// Rebuilds the handle of a mutex on the `key_len` bytes at `key` that another process (or an
/// earlier run of this one) took with the `token_len` bytes at `token` (what
/// `redlock_mux_lock_token` gave it), and extends it to `ttl_ms`. It succeeds only if a quorum
/// still holds the key with that token; the validity is measured from this check.
/// `REDLOCK_MUX_CONTENDED` when too few nodes hold it (it expired, or passed to someone
/// else); nothing is released then. A token that is not `REDLOCK_MUX_TOKEN_LEN` lowercase hex
/// characters gives `REDLOCK_MUX_INVALID_ARGUMENT` before anything is sent.
///
/// Safety caveat: a token is a capability. Resume only a lock whose original holder has
/// stopped using it; otherwise both believe they hold it. A fenced mutex is resumed as a
/// plain one (its fencing token is not recovered).
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `token` is NULL or points to `token_len` readable bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_resume_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_token(token, token_len, |tok| c.resume_lock(k, tok, t))
        })
    }
}

/// Rebuilds the handle of a read lock held with a token (see `redlock_mux_client_resume_lock`).
///
/// # Safety
/// As for `redlock_mux_client_resume_lock`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_resume_read_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_read_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_token(token, token_len, |tok| c.resume_read_lock(k, tok, t))
        })
    }
}

/// Rebuilds the handle of a write lock (fenced or not) held with a token (see
/// `redlock_mux_client_resume_lock`).
///
/// # Safety
/// As for `redlock_mux_client_resume_lock`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_resume_write_lock(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_write_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_token(token, token_len, |tok| c.resume_write_lock(k, tok, t))
        })
    }
}

/// Rebuilds the handle of an all-or-none lock on `count` keys held with a token (see
/// `redlock_mux_client_resume_lock`); the keys are given and checked as for
/// `redlock_mux_client_lock_all`.
///
/// # Safety
/// As for `redlock_mux_client_lock_all`; `token` is NULL or points to `token_len` readable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_resume_lock_all(
    client: *const redlock_mux_client,
    keys: *const *const u8,
    key_lens: *const usize,
    count: usize,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_multi_lock,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire_all(client, keys, key_lens, count, ttl_ms, out, |c, k, t| {
            with_token(token, token_len, |tok| c.resume_lock_all(k, tok, t))
        })
    }
}

/// `redlock_mux_client_acquire_permit`, waiting as `*options` says (see
/// `redlock_mux_client_lock_with`).
///
/// # Safety
/// As for `redlock_mux_client_lock_with`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_acquire_permit_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    ttl_ms: u64,
    options: *const redlock_mux_acquire_options,
    out: *mut *mut redlock_mux_permit,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_options(options, |o| c.semaphore(k, permits)?.acquire_with(t, o))
        })
    }
}

/// Rebuilds the handle of a permit of the semaphore of `permits` permits on a key, held with
/// a token (see `redlock_mux_client_resume_lock`): an extend round checks that a quorum of
/// nodes still admits it.
///
/// # Safety
/// As for `redlock_mux_client_resume_lock`.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_resume_permit(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    token: *const u8,
    token_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_permit,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, ttl_ms, out, |c, k, t| {
            with_token(token, token_len, |tok| {
                c.semaphore(k, permits)?.resume(tok, t)
            })
        })
    }
}

fn round_stats(r: &RoundStats) -> redlock_mux_round_stats {
    redlock_mux_round_stats {
        won: r.won,
        contended: r.contended,
        unreachable: r.unreachable,
    }
}

/// Writes to `*out` what the client's locks have been doing since it was built (shared with
/// every lock taken through it): acquisition rounds won, contended and unreachable per lock
/// kind, wake-ups, retries and cancellations, and how many nodes `redlock_mux_client_node_stats`
/// can tell of. Each counter is exact; counters read while other threads lock are not all of
/// one instant.
///
/// # Safety
/// `client` is NULL or a live client; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_stats(
    client: *const redlock_mux_client,
    out: *mut redlock_mux_stats,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(client, "client")?, Out::new(out, "out")?) };
        let s = handle.client.stats();
        out.write(redlock_mux_stats {
            mutex: round_stats(&s.kinds.mutex),
            read: round_stats(&s.kinds.read),
            write: round_stats(&s.kinds.write),
            all: round_stats(&s.kinds.all),
            fenced_mutex: round_stats(&s.kinds.fenced_mutex),
            fenced_write: round_stats(&s.kinds.fenced_write),
            semaphore: round_stats(&s.kinds.semaphore),
            wakeups: s.wakeups,
            retries: s.retries,
            cancellations: s.cancellations,
            node_count: s.nodes.len(),
        });
        Ok(())
    })
}

/// Writes to `*out` the failures and reply latency of node `node` (0 to `node_count - 1`, in
/// the order the nodes were added). `REDLOCK_MUX_INVALID_ARGUMENT` for a node the client does
/// not have.
///
/// # Safety
/// `client` is NULL or a live client; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_node_stats(
    client: *const redlock_mux_client,
    node: usize,
    out: *mut redlock_mux_node_stats,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(client, "client")?, Out::new(out, "out")?) };
        let nodes = handle.client.stats().nodes;
        let n: &NodeStats = nodes.get(node).ok_or_else(|| {
            Failure::new(
                REDLOCK_MUX_INVALID_ARGUMENT,
                format!(
                    "invalid argument: node {node} is not one of the client's {} nodes",
                    nodes.len()
                ),
            )
        })?;
        let micros = |d: Option<Duration>| d.map_or(0, |d| d.as_micros() as u64);
        let f = &n.failures;
        out.write(redlock_mux_node_stats {
            timeout_failures: f.timeout,
            connect_failures: f.connect,
            backoff_failures: f.backoff,
            io_failures: f.io,
            protocol_failures: f.protocol,
            server_failures: f.server,
            unexpected_reply_failures: f.unexpected_reply,
            setup_failures: f.setup,
            latency_samples: n.latency_samples as u64,
            latency_p50_us: micros(n.latency_p50),
            latency_p99_us: micros(n.latency_p99),
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last error message on this thread, through the C entry points.
    fn last_error() -> String {
        let mut buf = vec![0 as c_char; redlock_mux_last_error_length() + 1];
        let mut n = 0usize;
        // SAFETY: `buf` has `buf.len()` writable bytes; `n` is writable.
        let r = unsafe { redlock_mux_last_error_message(buf.as_mut_ptr(), buf.len(), &mut n) };
        assert_eq!(r, REDLOCK_MUX_OK);
        let bytes: Vec<u8> = buf[..n].iter().map(|&c| c as u8).collect();
        String::from_utf8(bytes).expect("messages are UTF-8")
    }

    #[test]
    fn a_panic_inside_the_boundary_becomes_a_result_code() {
        let r = boundary(|| panic!("deliberate panic for the test"));
        assert_eq!(r, REDLOCK_MUX_PANIC);
        assert!(last_error().contains("deliberate panic for the test"));
        boundary_void(|| panic!("also in a _free"));
        assert!(last_error().contains("also in a _free"));
    }

    #[test]
    fn the_last_error_tells_which_deadline_ended_a_wait() {
        let ended = Error::WaitEnded {
            deadline: Deadline::RetryCount,
            last: Box::new(Error::ValidityExpired {
                elapsed: Duration::from_millis(5),
            }),
        };
        let r = boundary(|| Err(ended.into()));
        assert_eq!(r, REDLOCK_MUX_VALIDITY_EXPIRED);
        assert_eq!(
            redlock_mux_last_error_deadline(),
            REDLOCK_MUX_DEADLINE_RETRY_COUNT
        );
        assert!(last_error().contains("retry count"));
        // Success leaves it; the next failure replaces it.
        assert_eq!(boundary(|| Ok(())), REDLOCK_MUX_OK);
        assert_eq!(
            redlock_mux_last_error_deadline(),
            REDLOCK_MUX_DEADLINE_RETRY_COUNT
        );
        let expired = Error::ValidityExpired {
            elapsed: Duration::from_millis(5),
        };
        boundary(|| Err(expired.into()));
        assert_eq!(
            redlock_mux_last_error_deadline(),
            REDLOCK_MUX_DEADLINE_VALIDITY
        );
        boundary(|| Err(null("x")));
        assert_eq!(redlock_mux_last_error_deadline(), REDLOCK_MUX_DEADLINE_NONE);
    }

    #[test]
    fn every_result_code_has_its_own_text() {
        let texts: Vec<&CStr> = (0..=REDLOCK_MUX_CANCELLED as u32)
            // SAFETY: `redlock_mux_result_text` returns a static NUL-terminated string.
            .map(|code| unsafe { CStr::from_ptr(redlock_mux_result_text(code)) })
            .collect();
        for (i, text) in texts.iter().enumerate() {
            assert_ne!(*text, c"unknown result code", "code {i}");
            assert!(!texts[..i].contains(text), "code {i} repeats {text:?}");
        }
    }

    #[test]
    fn a_setter_that_fails_or_panics_leaves_the_builder_as_it_was() {
        let b = into_handle(redlock_mux_client_builder {
            builder: Client::builder().nodes(["127.0.0.1:7"]).retry_count(5),
        });
        // SAFETY: `b` is a live builder, used by this thread only, until it is freed below.
        unsafe {
            let before = format!("{:?}", (*b).builder);
            let failed = update(b, |builder| {
                let _ = builder.retry_count(9);
                Err(Failure::new(REDLOCK_MUX_INVALID_ARGUMENT, "refused"))
            });
            assert_eq!(failed, REDLOCK_MUX_INVALID_ARGUMENT);
            assert_eq!(format!("{:?}", (*b).builder), before);
            let panicked = update(b, |builder| {
                let _ = builder.retry_count(9);
                panic!("deliberate panic in a setter")
            });
            assert_eq!(panicked, REDLOCK_MUX_PANIC);
            assert_eq!(format!("{:?}", (*b).builder), before);
            assert_eq!(
                redlock_mux_client_builder_set_rw_policy(b, 7),
                REDLOCK_MUX_INVALID_ARGUMENT
            );
            assert_eq!(format!("{:?}", (*b).builder), before);
            redlock_mux_client_builder_free(b);
        }
    }

    #[test]
    fn the_version_is_the_crate_version() {
        // SAFETY: `redlock_mux_version` returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(redlock_mux_version()) };
        assert_eq!(v.to_str(), Ok(env!("CARGO_PKG_VERSION")));
    }
}
