//! The checks of pointer arguments: every raw pointer C hands in becomes a reference, a slice or
//! an output slot here, after a check for NULL, and every handle is made and freed here.

use std::ptr;
use std::time::Duration;

use redlock::{InvalidArgument, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS};

use crate::error::{null, Failure};

/// `&*p`, after checking for NULL.
///
/// # Safety
/// `p` is NULL or points to a live `T` not being mutated for `'a`.
pub(crate) unsafe fn arg_ref<'a, T>(p: *const T, name: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller vouches for non-NULL pointers; NULL is turned into an error here.
    unsafe { p.as_ref() }.ok_or_else(|| null(name))
}

/// `&mut *p`, after checking for NULL.
///
/// # Safety
/// `p` is NULL or points to a live `T` that nothing else uses for `'a`.
pub(crate) unsafe fn arg_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: as for `arg_ref`, plus exclusivity, which the header asks of the caller.
    unsafe { p.as_mut() }.ok_or_else(|| null(name))
}

/// The `len` bytes at `p`, after checking for NULL (even when `len` is 0) and for a length no
/// slice can have.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay unchanged for `'a`.
pub(crate) unsafe fn arg_bytes<'a>(
    p: *const u8,
    len: usize,
    name: &str,
) -> Result<&'a [u8], Failure> {
    if p.is_null() {
        return Err(null(name));
    }
    if len > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "`{name}_len` {len} is larger than any buffer can be"
        )));
    }
    // SAFETY: non-NULL, in bounds by the caller's promise, length checked just above.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The `len` bytes at `p` as UTF-8 text (a node URL, a file name), after the checks of
/// `arg_bytes`. `what` names it in the message when it is not UTF-8.
///
/// # Safety
/// As for `arg_bytes`.
pub(crate) unsafe fn arg_str<'a>(
    p: *const u8,
    len: usize,
    name: &str,
    what: &str,
) -> Result<&'a str, Failure> {
    // SAFETY: forwarded caller promise.
    let bytes = unsafe { arg_bytes(p, len, name) }?;
    std::str::from_utf8(bytes).map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A key: like `arg_bytes`, but a length over the cap is refused before the slice is made, so
/// a wrong length cannot make us form a slice past the caller's buffer.
///
/// # Safety
/// As for `arg_bytes`.
pub(crate) unsafe fn arg_key<'a>(
    p: *const u8,
    len: usize,
    name: &str,
) -> Result<&'a [u8], Failure> {
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

/// The `count` keys at `keys`, with their lengths at `key_lens`: checked for NULL (the arrays
/// even when `count` is 0, and every key), and for a count over the cap before either array is
/// read.
///
/// # Safety
/// `keys` and `key_lens` are NULL or point to `count` readable elements; each `keys[i]` is NULL
/// or points to `key_lens[i]` readable bytes; all unchanged for `'a`.
pub(crate) unsafe fn arg_keys<'a>(
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

/// An output slot, checked for NULL before any work is done, so that a call never does
/// something (such as taking a lock) whose result it then cannot hand back.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `p` is NULL or valid for a write of one `T` (not necessarily initialised).
    pub(crate) unsafe fn new(p: *mut T, name: &str) -> Result<Out<T>, Failure> {
        if p.is_null() {
            return Err(null(name));
        }
        Ok(Out(p))
    }

    pub(crate) fn write(self, value: T) {
        // SAFETY: checked non-NULL and writable in `new`; `write` does not drop whatever
        // uninitialised value the caller had there.
        unsafe { ptr::write(self.0, value) }
    }
}

/// Copies `src` to the caller's buffer of `buf_len` bytes at `buf` and writes its length to
/// `out_n`, or gives `REDLOCK_MUX_BUFFER_TOO_SMALL` and writes nothing.
///
/// # Safety
/// `buf` is non-NULL and points to `buf_len` writable bytes that do not overlap `src`.
pub(crate) unsafe fn copy_out(
    src: &[u8],
    buf: *mut u8,
    buf_len: usize,
    out_n: Out<usize>,
    what: &str,
) -> Result<(), Failure> {
    if buf_len < src.len() {
        return Err(Failure::new(
            crate::error::REDLOCK_MUX_BUFFER_TOO_SMALL,
            format!("the {what} is {} bytes, the buffer {buf_len}", src.len()),
        ));
    }
    // SAFETY: room for `buf_len >= src.len()` bytes, no overlap (caller's promise).
    unsafe { ptr::copy_nonoverlapping(src.as_ptr(), buf, src.len()) };
    out_n.write(src.len());
    Ok(())
}

/// A heap handle the caller now owns.
pub(crate) fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back a handle made by `into_handle` and drops it; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from `into_handle::<T>` and was not freed yet.
pub(crate) unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: made by `Box::into_raw` of the same type, freed once, by the caller's promise.
        drop(unsafe { Box::from_raw(p) });
    }
}

pub(crate) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
