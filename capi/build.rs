//! Gives libredlock_mux.so its SONAME: a program linked against the library records that name
//! (not the path it was linked from), and the dynamic loader finds the library wherever it
//! looks for libraries. The name carries the ABI version, which an incompatible change of the
//! C API bumps: `libredlock_mux.so.0.MINOR` before 1.0 (where a minor release may break the
//! ABI, as cargo-c names 0.x libraries), `libredlock_mux.so.MAJOR` from 1.0 on.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    // ELF targets only; others name their shared libraries their own way.
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let elf = matches!(
        os.as_str(),
        "linux" | "android" | "freebsd" | "netbsd" | "openbsd" | "dragonfly" | "illumos"
    );
    if !elf {
        return;
    }
    let major = env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let minor = env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets the version");
    let abi = if major == "0" {
        format!("0.{minor}")
    } else {
        major
    };
    let soname = format!("libredlock_mux.so.{abi}");
    // rustc hands link arguments to a C compiler driver (cc, clang, a cross gcc), or, when the
    // target's linker is a linker itself (rust-lld, ld.lld), straight to it.
    let linker = env::var("RUSTC_LINKER").unwrap_or_default();
    let name = Path::new(&linker)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let direct =
        name == "ld" || name.ends_with("-ld") || name.starts_with("ld.") || name.ends_with("lld");
    if direct {
        println!("cargo:rustc-cdylib-link-arg=-soname={soname}");
    } else {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
}
