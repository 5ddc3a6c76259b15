//! Per-call options of the waiting acquisitions, and the cancel handle.

use redlock::{Acquire, Cancel};

use crate::args::{arg_ref, free_handle, into_handle, millis, Out};
use crate::error::{boundary, boundary_void, redlock_mux_result, Failure};

/// Cancels waiting acquisitions, from any thread. Made by `redlock_mux_cancel_new`, freed by
/// `redlock_mux_cancel_free`. Given to calls through `redlock_mux_acquire_options.cancel`.
pub struct redlock_mux_cancel {
    cancel: Cancel,
}

/// `redlock_mux_acquire_options.set`: `timeout_ms` replaces the client's wait timeout.
pub const REDLOCK_MUX_ACQUIRE_TIMEOUT: u32 = 1;
/// `redlock_mux_acquire_options.set`: `retries` replaces the client's retry count.
pub const REDLOCK_MUX_ACQUIRE_RETRIES: u32 = 2;

/// How one waiting acquisition waits, in place of the client's settings: the `options` of
/// `redlock_mux_client_lock` and the other waiting acquisitions. A NULL `options`, or a zeroed
/// struct (`redlock_mux_acquire_options opts = {0};`), keeps every client setting and has no
/// cancel handle.
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

/// The options at `options`, checked, as the Rust API takes them; NULL gives the client's
/// settings.
///
/// # Safety
/// `options` is NULL or points to a readable struct whose `cancel` is NULL or a live handle.
unsafe fn arg_options(options: *const redlock_mux_acquire_options) -> Result<Acquire, Failure> {
    // SAFETY: forwarded caller promise; NULL means no options.
    let Some(o) = (unsafe { options.as_ref() }) else {
        return Ok(Acquire::new());
    };
    let known = REDLOCK_MUX_ACQUIRE_TIMEOUT | REDLOCK_MUX_ACQUIRE_RETRIES;
    if o.set & !known != 0 {
        return Err(Failure::invalid(format!(
            "`options.set` has unknown bits {:#x}",
            o.set & !known
        )));
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

/// Runs a waiting acquisition's `f` with the options at `options` (NULL: the client's).
///
/// # Safety
/// As for `arg_options`.
pub(crate) unsafe fn with_options<L>(
    options: *const redlock_mux_acquire_options,
    f: impl FnOnce(&Acquire) -> Result<L, redlock::Error>,
) -> Result<L, Failure> {
    // SAFETY: forwarded caller promise.
    let options = unsafe { arg_options(options)? };
    Ok(f(&options)?)
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
