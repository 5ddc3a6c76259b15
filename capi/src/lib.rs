//! The C API of redlock-mux: `libredlock_mux.a`, `libredlock_mux.so`, declared in
//! `include/redlock_mux.h` (generated from this crate by cbindgen).
//!
//! Conventions, the same for every function:
//!
//! - **Handles are opaque.** `redlock_mux_client_builder`, `redlock_mux_client`,
//!   `redlock_mux_lock` (one handle for every kind of lock) and `redlock_mux_cancel` are only
//!   ever seen through pointers. Each one made by a `_new`, `_build` or acquisition function is
//!   owned by the caller and freed with the matching `_free`, which accepts NULL. Freeing twice,
//!   or using a handle after freeing it, is undefined behaviour.
//! - **Results are numbered.** Every fallible function returns a `redlock_mux_result`, whose
//!   values are fixed forever. `redlock_mux_result_text` names a code;
//!   `redlock_mux_last_error_message` gives the full message of the last failure on the
//!   calling thread (which nodes failed, and how), `redlock_mux_last_error_deadline` which
//!   deadline ended it.
//! - **NULL is checked.** Every pointer argument is checked, and NULL gives
//!   `REDLOCK_MUX_NULL_PARAMETER` before anything else happens; the few that may be NULL say
//!   so (`options`, `user_data`).
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
//!
//! The files, by concern: `error` (result codes, the last error, the panic boundary), `args`
//! (the checks of pointer arguments), `client` (the builder and the client), `acquire` (one
//! function per kind of lock and form of acquisition), `lock` (the one lock handle), `options`
//! (per-call options and cancellation), `stats`.

// C hands this crate raw pointers, and turning them into references cannot be done safely.
// Every such step goes through one of the small helpers of `args`, each of which checks for
// NULL first.
#![allow(unsafe_code)]
// The C names (`redlock_mux_client`, `REDLOCK_MUX_OK`) are what C programmers read in the header.
#![allow(non_camel_case_types)]

mod acquire;
mod args;
mod client;
mod error;
mod lock;
mod options;
mod stats;

use std::ffi::{c_char, CStr};

/// The major version of the library. From 1.0 on, an incompatible change of the C API bumps
/// it, and with it the SONAME (`libredlock_mux.so.MAJOR`); before 1.0 the minor version does
/// (`libredlock_mux.so.0.MINOR`).
pub const REDLOCK_MUX_VERSION_MAJOR: u32 = 0;
/// The minor version of the library: new functions and results bump it (and, before 1.0, an
/// incompatible change).
pub const REDLOCK_MUX_VERSION_MINOR: u32 = 1;
/// The patch version of the library.
pub const REDLOCK_MUX_VERSION_PATCH: u32 = 0;

/// A number of the package version, as cargo gives it.
const fn parse_version(digits: &str) -> u32 {
    let digits = digits.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < digits.len() {
        assert!(digits[i].is_ascii_digit(), "a version number is digits");
        value = value * 10 + (digits[i] - b'0') as u32;
        i += 1;
    }
    value
}

// The macros of the header are literals (cbindgen reads them as written); they must say what
// Cargo.toml says.
const _: () = assert!(REDLOCK_MUX_VERSION_MAJOR == parse_version(env!("CARGO_PKG_VERSION_MAJOR")));
const _: () = assert!(REDLOCK_MUX_VERSION_MINOR == parse_version(env!("CARGO_PKG_VERSION_MINOR")));
const _: () = assert!(REDLOCK_MUX_VERSION_PATCH == parse_version(env!("CARGO_PKG_VERSION_PATCH")));

/// The library's version, `"MAJOR.MINOR.PATCH"` (such as `"0.1.0"`), which a program may
/// compare with the `REDLOCK_MUX_VERSION_*` macros it was compiled with. Never NULL; static,
/// must not be freed.
#[no_mangle]
pub extern "C" fn redlock_mux_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => panic!("the version contains a NUL"),
        };
    VERSION.as_ptr()
}

/// 1 when this library was built with TLS (the `tls` feature: `rediss://` node URLs,
/// `redlock_mux_client_builder_add_tls_ca_file`, `redlock_mux_client_builder_set_tls_client_cert`),
/// 0 when not.
#[no_mangle]
pub extern "C" fn redlock_mux_has_tls() -> i32 {
    i32::from(cfg!(feature = "tls"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_package_version() {
        // SAFETY: `redlock_mux_version` returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(redlock_mux_version()) };
        assert_eq!(v.to_str(), Ok(env!("CARGO_PKG_VERSION")));
        let macros = format!(
            "{REDLOCK_MUX_VERSION_MAJOR}.{REDLOCK_MUX_VERSION_MINOR}.{REDLOCK_MUX_VERSION_PATCH}"
        );
        assert_eq!(v.to_str(), Ok(macros.as_str()));
    }
}
