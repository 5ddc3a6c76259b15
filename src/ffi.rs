//! The C API, declared in `include/redlock_mux.h` (generated from this file by cbindgen).
//!
//! Conventions, the same for every function:
//!
//! - **Handles are opaque.** `redlock_mux_client_builder`, `redlock_mux_client` and
//!   `redlock_mux_lock` are only ever seen through pointers. Each one made by a `_new`, `_build`
//!   or lock function is owned by the caller and freed with the matching `_free`, which accepts
//!   NULL. Freeing twice, or using a handle after freeing it, is undefined behaviour.
//! - **Results are numbered.** Every fallible function returns a `redlock_mux_result`, whose
//!   values are fixed forever. `redlock_mux_result_text` names a code;
//!   `redlock_mux_last_error_message` gives the full message of the last failure on the
//!   calling thread (which nodes failed, and how).
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
//! once. A lock keeps what it needs of its client alive: the client may be freed before the
//! locks taken through it.

// This is the one module of the crate that may use `unsafe`: C hands us raw pointers, and
// turning them into references cannot be done safely. Every such step goes through one of the
// small helpers below (`arg_ref`, `arg_mut`, `arg_bytes`, `out_ptr`, `into_handle`,
// `free_handle`), each of which checks for NULL first.
#![allow(unsafe_code)]
// The C names (`redlock_mux_client`, `REDLOCK_MUX_OK`) are what C programmers read in the header.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::time::Duration;

use crate::{
    Client, ClientBuilder, Error, InvalidArgument, Lock, ReadLock, RwPolicy, WriteLock, MAX_KEY_LEN,
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
    /// The lock handle was already released; only `redlock_mux_lock_free` may follow.
    REDLOCK_MUX_RELEASED = 8,
    /// The library panicked: a bug. The handles involved must only be freed.
    REDLOCK_MUX_PANIC = 9,
}

use redlock_mux_result::*;

/// The length of a lock's token, in bytes: 40 hexadecimal characters (160 random bits).
pub const REDLOCK_MUX_TOKEN_LEN: usize = 40;
const _: () = assert!(REDLOCK_MUX_TOKEN_LEN == crate::rng::TOKEN_LEN);

/// The longest key accepted, in bytes.
pub const REDLOCK_MUX_MAX_KEY_LEN: usize = 64 * 1024;
const _: () = assert!(REDLOCK_MUX_MAX_KEY_LEN == MAX_KEY_LEN);

/// Builds a `redlock_mux_client`: node URLs and options. Made by
/// `redlock_mux_client_builder_new`, freed by `redlock_mux_client_builder_free`.
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

/// `redlock_mux_client_builder_set_rw_policy`: new readers get in whenever no writer holds the
/// lock (the default). A stream of overlapping readers can keep a writer out.
pub const REDLOCK_MUX_RW_READ_PREFERRING: u32 = 0;
/// `redlock_mux_client_builder_set_rw_policy`: a waiting writer keeps new readers out, so the
/// readers in place drain and the writer gets in within one reader hold.
pub const REDLOCK_MUX_RW_WRITE_PREFERRING: u32 = 1;

/// A failed call: its code, and the message `redlock_mux_last_error_message` gives.
struct Failure {
    code: redlock_mux_result,
    message: String,
}

impl Failure {
    fn new(code: redlock_mux_result, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        // Exhaustive on purpose: a new kind of error must be given its own number here.
        let code = match &e {
            Error::InvalidArgument(_) => REDLOCK_MUX_INVALID_ARGUMENT,
            Error::Contended { .. } => REDLOCK_MUX_CONTENDED,
            Error::QuorumUnreachable { .. } => REDLOCK_MUX_QUORUM_UNREACHABLE,
            Error::ValidityExpired { .. } => REDLOCK_MUX_VALIDITY_EXPIRED,
            Error::Io(_) => REDLOCK_MUX_IO,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<InvalidArgument> for Failure {
    fn from(a: InvalidArgument) -> Failure {
        Error::from(a).into()
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: String) {
    // `try_with`: during thread teardown the slot may be gone; the code still gets through.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = message);
}

/// The panic boundary every exported function runs in: a panic becomes `REDLOCK_MUX_PANIC`,
/// a failure records its message for `redlock_mux_last_error_message`.
fn boundary(body: impl FnOnce() -> Result<(), Failure>) -> redlock_mux_result {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => REDLOCK_MUX_OK,
        Ok(Err(failure)) => {
            set_last_error(failure.message);
            failure.code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(format!(
                "redlock-mux panicked (a bug in the library): {what}"
            ));
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
unsafe fn arg_key<'a>(p: *const u8, len: usize) -> Result<&'a [u8], Failure> {
    if !p.is_null() && len > MAX_KEY_LEN {
        return Err(InvalidArgument::KeyTooLong {
            len,
            max: MAX_KEY_LEN,
        }
        .into());
    }
    // SAFETY: forwarded caller promise.
    unsafe { arg_bytes(p, len, "key") }
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
    catch_unwind(|| LAST_ERROR.try_with(|slot| slot.borrow().len()).unwrap_or(0)).unwrap_or(0)
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
            let message = slot.borrow();
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

/// Changes a builder in place through the Rust builder's by-value setters.
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
        handle.builder = f(std::mem::take(&mut handle.builder))?;
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

/// How many times `redlock_mux_client_lock` retries after a failed attempt. Default 32.
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

/// The base delay between attempts of `redlock_mux_client_lock`, in milliseconds; each delay
/// is drawn from [d/2, 3d/2). Default 50.
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

/// The longest `redlock_mux_client_lock` waits in all, in milliseconds, whatever the retry
/// count. Default 10000.
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

/// Checks every setting, resolves every node, and writes a new client to `*out`. Nothing is
/// sent yet: connections open on first use. The builder is left as it was and must still be
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

/// Frees a client. NULL is a no-op. Locks taken through it stay usable.
///
/// # Safety
/// `client` is NULL or a client not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_free(client: *mut redlock_mux_client) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(client) })
}

/// The shared body of every acquisition: checks the arguments, runs `take`, hands back the
/// new handle.
///
/// # Safety
/// As for `redlock_mux_client_lock`.
unsafe fn acquire<T>(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    out: *mut *mut T,
    take: impl FnOnce(&Client, &[u8]) -> Result<T, Error>,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, key, out) = unsafe {
            (
                arg_ref(client, "client")?,
                arg_key(key, key_len)?,
                Out::new(out, "out")?,
            )
        };
        out.write(into_handle(take(&handle.client, key)?));
        Ok(())
    })
}

/// The shared body of the two mutex acquisitions.
///
/// # Safety
/// As for `redlock_mux_client_lock`.
unsafe fn lock_with(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    ttl_ms: u64,
    out: *mut *mut redlock_mux_lock,
    wait: bool,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        acquire(client, key, key_len, out, |c, key| {
            let lock = if wait {
                c.lock(key, millis(ttl_ms))
            } else {
                c.try_lock(key, millis(ttl_ms))
            }?;
            Ok(redlock_mux_lock { held: Some(lock) })
        })
    }
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
    unsafe { lock_with(client, key, key_len, ttl_ms, out, false) }
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
    unsafe { lock_with(client, key, key_len, ttl_ms, out, true) }
}

/// What the C API does with every kind of held lock.
trait Held: Sized {
    fn extend(&mut self, ttl: Duration) -> Result<(), Error>;
    fn validity(&self) -> Duration;
    fn token(&self) -> &[u8];
    fn release(self) -> Result<(), Error>;
}

impl Held for Lock {
    fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        Lock::extend(self, ttl)
    }
    fn validity(&self) -> Duration {
        Lock::validity(self)
    }
    fn token(&self) -> &[u8] {
        Lock::token(self)
    }
    fn release(self) -> Result<(), Error> {
        Lock::release(self)
    }
}

macro_rules! held_by_inherent_methods {
    ($($t:ty),*) => {$(
        impl Held for $t {
            fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
                <$t>::extend(self, ttl)
            }
            fn validity(&self) -> Duration {
                <$t>::validity(self)
            }
            fn token(&self) -> &[u8] {
                <$t>::token(self)
            }
            fn release(self) -> Result<(), Error> {
                <$t>::release(self)
            }
        }
    )*};
}
held_by_inherent_methods!(ReadLock, WriteLock);

fn released() -> Failure {
    Failure::new(
        REDLOCK_MUX_RELEASED,
        "the lock was already released; only free it",
    )
}

fn held<T>(slot: &Option<T>) -> Result<&T, Failure> {
    slot.as_ref().ok_or_else(released)
}

/// # Safety
/// `out` is NULL or writable.
unsafe fn held_validity<T: Held>(slot: &Option<T>, out: *mut u64) -> Result<(), Failure> {
    // SAFETY: forwarded caller promise.
    let out = unsafe { Out::new(out, "out_ms") }?;
    let ms = held(slot)?.validity().as_millis();
    out.write(u64::try_from(ms).unwrap_or(u64::MAX));
    Ok(())
}

/// # Safety
/// `buf` is NULL or points to `buf_len` writable bytes; `out_n` is NULL or writable.
unsafe fn held_token<T: Held>(
    slot: &Option<T>,
    buf: *mut u8,
    buf_len: usize,
    out_n: *mut usize,
) -> Result<(), Failure> {
    if buf.is_null() {
        return Err(null("buf"));
    }
    // SAFETY: forwarded caller promise.
    let out_n = unsafe { Out::new(out_n, "out_n") }?;
    let token = held(slot)?.token();
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
}

fn held_extend<T: Held>(slot: &mut Option<T>, ttl_ms: u64) -> Result<(), Failure> {
    slot.as_mut().ok_or_else(released)?.extend(millis(ttl_ms))?;
    Ok(())
}

fn held_release<T: Held>(slot: &mut Option<T>) -> Result<(), Failure> {
    slot.take().ok_or_else(released)?.release()?;
    Ok(())
}

/// Resets the lock's TTL to `ttl_ms` milliseconds on every node that still holds its token.
/// Succeeds only if a quorum agrees before the current validity ends; on failure the lock is
/// left as it was (held until its current validity ends, if it was held).
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
        let handle = unsafe { arg_mut(lock, "lock") }?;
        held_extend(&mut handle.held, ttl_ms)
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_validity(&arg_ref(lock, "lock")?.held, out_ms) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_token(&arg_ref(lock, "lock")?.held, buf, buf_len, out_n) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promise.
        held_release(&mut unsafe { arg_mut(lock, "lock") }?.held)
    })
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

// The read and write lock functions below are written out rather than generated by a macro:
// cbindgen reads the source without expanding macros, so generated functions would be missing
// from the header. Each body is one call to a generic helper above.

/// One attempt to take the read lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds,
/// without retrying. The lock is shared: many readers may hold it at once, but no writer. On success writes a new handle to `*out`;
/// `REDLOCK_MUX_CONTENDED` means the other side holds it.
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
        acquire(client, key, key_len, out, |c, key| {
            Ok(redlock_mux_read_lock {
                held: Some(c.try_read_lock(key, millis(ttl_ms))?),
            })
        })
    }
}

/// Takes the read lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds, waiting as the
/// client's retry count and wait timeout allow. The lock is shared: many readers may hold it at once, but no writer. On success writes a new
/// handle to `*out`.
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
        acquire(client, key, key_len, out, |c, key| {
            Ok(redlock_mux_read_lock {
                held: Some(c.read_lock(key, millis(ttl_ms))?),
            })
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
    boundary(|| {
        // SAFETY: forwarded caller promise.
        held_extend(&mut unsafe { arg_mut(lock, "lock") }?.held, ttl_ms)
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_validity(&arg_ref(lock, "lock")?.held, out_ms) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_token(&arg_ref(lock, "lock")?.held, buf, buf_len, out_n) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promise.
        held_release(&mut unsafe { arg_mut(lock, "lock") }?.held)
    })
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
/// without retrying. The lock is exclusive: no reader and no other writer may hold it. On success writes a new handle to `*out`;
/// `REDLOCK_MUX_CONTENDED` means the other side holds it.
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
        acquire(client, key, key_len, out, |c, key| {
            Ok(redlock_mux_write_lock {
                held: Some(c.try_write_lock(key, millis(ttl_ms))?),
            })
        })
    }
}

/// Takes the write lock on the `key_len` bytes at `key` for `ttl_ms` milliseconds, waiting as the
/// client's retry count and wait timeout allow. The lock is exclusive: no reader and no other writer may hold it. On success writes a new
/// handle to `*out`.
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
        acquire(client, key, key_len, out, |c, key| {
            Ok(redlock_mux_write_lock {
                held: Some(c.write_lock(key, millis(ttl_ms))?),
            })
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
    boundary(|| {
        // SAFETY: forwarded caller promise.
        held_extend(&mut unsafe { arg_mut(lock, "lock") }?.held, ttl_ms)
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_validity(&arg_ref(lock, "lock")?.held, out_ms) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promises.
        unsafe { held_token(&arg_ref(lock, "lock")?.held, buf, buf_len, out_n) }
    })
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
    boundary(|| {
        // SAFETY: forwarded caller promise.
        held_release(&mut unsafe { arg_mut(lock, "lock") }?.held)
    })
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
    fn every_result_code_has_its_own_text() {
        let texts: Vec<&CStr> = (0..=REDLOCK_MUX_PANIC as u32)
            // SAFETY: `redlock_mux_result_text` returns a static NUL-terminated string.
            .map(|code| unsafe { CStr::from_ptr(redlock_mux_result_text(code)) })
            .collect();
        for (i, text) in texts.iter().enumerate() {
            assert_ne!(*text, c"unknown result code", "code {i}");
            assert!(!texts[..i].contains(text), "code {i} repeats {text:?}");
        }
    }

    #[test]
    fn the_version_is_the_crate_version() {
        // SAFETY: `redlock_mux_version` returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(redlock_mux_version()) };
        assert_eq!(v.to_str(), Ok(env!("CARGO_PKG_VERSION")));
    }
}
