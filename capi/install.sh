#!/usr/bin/env bash
# Builds the C library of redlock-mux and installs it where C programs find it:
#
#   LIBDIR/libredlock_mux.a
#   LIBDIR/libredlock_mux.so.MAJOR.MINOR.PATCH (SONAME libredlock_mux.so.MAJOR), and the
#     symlinks libredlock_mux.so.MAJOR and libredlock_mux.so
#   INCLUDEDIR/redlock_mux.h
#   LIBDIR/pkgconfig/redlock_mux.pc
#
# Usage: bash capi/install.sh [--prefix DIR] [--libdir DIR] [--includedir DIR]
#                             [--target TRIPLE] [--profile NAME] [--target-dir DIR]
#                             [--library-type both|staticlib|cdylib] [--features tls]
#
#   --prefix        default /usr/local; LIBDIR is PREFIX/lib, INCLUDEDIR PREFIX/include
#   --target        a Rust target triple, to cross-build (its linker set as cargo wants it)
#   --profile       the cargo profile, default release
#   --library-type  what to build and install, default both; the header and the .pc always
#   --features      cargo features of the C library: `tls` for rediss:// nodes (rustls)
#
# DESTDIR, when set, goes before every path written (for packagers); the .pc still names the
# prefix. After installing into a system prefix, run ldconfig. Needs cargo, and nothing else
# beyond coreutils.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

prefix=/usr/local
libdir=""
includedir=""
target=""
profile=release
target_dir=""
library_type=both
features=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --includedir) includedir="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --target-dir) target_dir="$2"; shift 2 ;;
    --library-type) library_type="$2"; shift 2 ;;
    --features) features="$2"; shift 2 ;;
    -h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$library_type" in
both) crate_types=staticlib,cdylib ;;
staticlib | cdylib) crate_types="$library_type" ;;
*) echo "install.sh: --library-type is both, staticlib or cdylib" >&2; exit 2 ;;
esac
# Paths under the prefix stay relative in the .pc, so that pkg-config's --define-prefix works.
pc_libdir='${exec_prefix}/lib'
pc_includedir='${prefix}/include'
if [ -n "$libdir" ]; then pc_libdir="$libdir"; else libdir="$prefix/lib"; fi
if [ -n "$includedir" ]; then pc_includedir="$includedir"; else includedir="$prefix/include"; fi

DESTDIR="${DESTDIR:-}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' capi/Cargo.toml | head -n 1)"
major="${version%%.*}"

# Build. The static library's note lists the system libraries a static link needs.
cargo_args=(-p redlock-mux-capi --lib --profile "$profile" --crate-type "$crate_types")
if [ -n "$target" ]; then cargo_args+=(--target "$target"); fi
if [ -n "$target_dir" ]; then cargo_args+=(--target-dir "$target_dir"); fi
if [ -n "$features" ]; then cargo_args+=(--features "$features"); fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "+ cargo rustc ${cargo_args[*]} -- --print native-static-libs"
if ! cargo rustc "${cargo_args[@]}" -- --print native-static-libs 2>"$log"; then
    cat "$log" >&2
    exit 1
fi
grep -Ev '^(note: (native-static-libs|link against the following)|$)' "$log" >&2 || true

if [ -z "$target_dir" ]; then
    target_dir="${CARGO_TARGET_DIR:-$(cargo metadata --no-deps --format-version 1 |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}"
fi
case "$profile" in
dev | test) profile_dir=debug ;;
bench) profile_dir=release ;;
*) profile_dir="$profile" ;;
esac
built="$target_dir/${target:+$target/}$profile_dir"

run() {
    echo "+ $*"
    "$@"
}

run install -d "$DESTDIR$libdir/pkgconfig" "$DESTDIR$includedir"
run install -m 644 include/redlock_mux.h "$DESTDIR$includedir/redlock_mux.h"
if [ "$library_type" != cdylib ]; then
    run install -m 644 "$built/libredlock_mux.a" "$DESTDIR$libdir/libredlock_mux.a"
fi
if [ "$library_type" != staticlib ]; then
    run install -m 755 "$built/libredlock_mux.so" "$DESTDIR$libdir/libredlock_mux.so.$version"
    run ln -sf "libredlock_mux.so.$version" "$DESTDIR$libdir/libredlock_mux.so.$major"
    run ln -sf "libredlock_mux.so.$version" "$DESTDIR$libdir/libredlock_mux.so"
fi

# Libs.private: what rustc says a static link needs, less what every C compiler driver links
# on its own: libc, and the unwinder (libgcc_s, or libgcc_eh with -static, which has no
# libgcc_s to link).
pc="$DESTDIR$libdir/pkgconfig/redlock_mux.pc"
if [ "$library_type" = cdylib ] && [ -f "$pc" ]; then
    exit 0 # the static library's install wrote it, with its Libs.private
fi
private=""
for lib in $(sed -n 's/^note: native-static-libs: //p' "$log" | tail -n 1); do
    case "$lib" in
    -lc | -lgcc_s) ;;
    *) private="${private:+$private }$lib" ;;
    esac
done
echo "+ write $pc"
cat >"$pc" <<PC
prefix=$prefix
exec_prefix=\${prefix}
libdir=$pc_libdir
includedir=$pc_includedir

Name: redlock_mux
Description: Redlock distributed locks over N Redis masters (the C library of redlock-mux)
Version: $version
Libs: -L\${libdir} -lredlock_mux
Libs.private: $private
Cflags: -I\${includedir}
PC
