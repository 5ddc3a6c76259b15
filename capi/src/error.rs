//! Result codes, the last error of each thread, and the panic boundary every function runs in.

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use redlock::internals::{DeadlineKind, ErrorKind};
use redlock::{Deadline, Error, InvalidArgument};

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
    /// The lock handle was already released (by `redlock_mux_lock_release`, or by a downgrade
    /// that failed); only `redlock_mux_lock_free` may follow.
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
    /// The lock does not support the call, and is left as it was: its kind has no such thing
    /// (a fencing token of a lock without one, a downgrade of a lock that is not a write lock,
    /// the keys of a set asked of a lock on one key), or it is kept alive, and the keeper
    /// thread alone extends it (`_extend`, `_downgrade`, `_keep_alive` again).
    REDLOCK_MUX_UNSUPPORTED = 12,
    /// `redlock_mux_client_close` gave up before every release the client sent had reached
    /// every node: the nodes the message names stopped answering, or could not be reached
    /// again. What those releases were to delete stays there until its TTL runs out.
    REDLOCK_MUX_UNDELIVERED = 13,
    /// The lock handle is a copy that a child process inherited through `fork()`: only the
    /// process that took the lock may release, extend, downgrade or keep it alive. Nothing was
    /// sent; the lock stays its holder's. The child may only free the handle, which does not
    /// touch the lock either.
    REDLOCK_MUX_OTHER_PROCESS = 14,
}

pub use redlock_mux_result::*;

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

/// A failed call: its code, the message `redlock_mux_last_error_message` gives, and the
/// deadline `redlock_mux_last_error_deadline` gives.
pub(crate) struct Failure {
    code: redlock_mux_result,
    message: String,
    deadline: redlock_mux_deadline,
}

impl Failure {
    pub(crate) fn new(code: redlock_mux_result, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            deadline: REDLOCK_MUX_DEADLINE_NONE,
        }
    }

    /// `REDLOCK_MUX_INVALID_ARGUMENT`, with the library's usual prefix.
    pub(crate) fn invalid(what: impl std::fmt::Display) -> Failure {
        Failure::new(
            REDLOCK_MUX_INVALID_ARGUMENT,
            format!("invalid argument: {what}"),
        )
    }
}

/// A NULL where a pointer was needed.
pub(crate) fn null(name: &str) -> Failure {
    Failure::new(REDLOCK_MUX_NULL_PARAMETER, format!("`{name}` is NULL"))
}

/// The number of the deadline that ended an operation.
fn deadline_code(deadline: Option<Deadline>) -> redlock_mux_deadline {
    // Without a wildcard on purpose: a new deadline must be given its own number here.
    match deadline.map(DeadlineKind::of) {
        None => REDLOCK_MUX_DEADLINE_NONE,
        Some(DeadlineKind::WaitTimeout) => REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT,
        Some(DeadlineKind::RetryCount) => REDLOCK_MUX_DEADLINE_RETRY_COUNT,
        Some(DeadlineKind::Validity) => REDLOCK_MUX_DEADLINE_VALIDITY,
        Some(DeadlineKind::NodeTimeout) => REDLOCK_MUX_DEADLINE_NODE_TIMEOUT,
    }
}

/// The result code of an error.
pub(crate) fn failure_code(e: &Error) -> redlock_mux_result {
    // Without a wildcard on purpose: a new kind of error must be given its own number here.
    match ErrorKind::of(e) {
        ErrorKind::InvalidArgument => REDLOCK_MUX_INVALID_ARGUMENT,
        ErrorKind::Contended => REDLOCK_MUX_CONTENDED,
        ErrorKind::QuorumUnreachable => REDLOCK_MUX_QUORUM_UNREACHABLE,
        ErrorKind::ValidityExpired => REDLOCK_MUX_VALIDITY_EXPIRED,
        ErrorKind::Io => REDLOCK_MUX_IO,
        ErrorKind::Config => REDLOCK_MUX_CONFIG,
        // A wait that ended is reported as its last attempt was (most often contended); the
        // message names the deadline.
        ErrorKind::WaitEnded => match e {
            Error::WaitEnded { last, .. } => failure_code(last),
            _ => unreachable!("ErrorKind::of gives WaitEnded for WaitEnded only"),
        },
        ErrorKind::Cancelled => REDLOCK_MUX_CANCELLED,
        ErrorKind::Undelivered => REDLOCK_MUX_UNDELIVERED,
        ErrorKind::OtherProcess => REDLOCK_MUX_OTHER_PROCESS,
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
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Failure>) -> redlock_mux_result {
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
pub(crate) fn boundary_void(body: impl FnOnce()) {
    let _ = boundary(|| {
        body();
        Ok(())
    });
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
        12 => c"not supported by this lock",
        13 => c"releases not delivered to every node",
        14 => c"the lock belongs to another process",
        _ => c"unknown result code",
    };
    text.as_ptr()
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The last error message on this thread, through the C entry points.
    pub(crate) fn last_error() -> String {
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
        let texts: Vec<&CStr> = (0..=REDLOCK_MUX_OTHER_PROCESS as u32)
            // SAFETY: `redlock_mux_result_text` returns a static NUL-terminated string.
            .map(|code| unsafe { CStr::from_ptr(redlock_mux_result_text(code)) })
            .collect();
        for (i, text) in texts.iter().enumerate() {
            assert_ne!(*text, c"unknown result code", "code {i}");
            assert!(!texts[..i].contains(text), "code {i} repeats {text:?}");
        }
    }
}
