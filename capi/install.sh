#!/usr/bin/env bash
# Builds the C library of redlock-mux and installs it where C programs find it:
#
#   LIBDIR/libredlock_mux.a
#   LIBDIR/libredlock_mux.so.MAJOR.MINOR.PATCH, with the SONAME libredlock_mux.so.ABI (ABI is
#     0.MINOR before 1.0, MAJOR from 1.0 on), and the symlinks libredlock_mux.so.ABI and
#     libredlock_mux.so
#   INCLUDEDIR/redlock_mux.h
#   LIBDIR/pkgconfig/redlock_mux.pc
#   LIBDIR/cmake/redlock_mux/redlock_muxConfig.cmake and redlock_muxConfigVersion.cmake, for
#     find_package(redlock_mux CONFIG): the targets redlock_mux::redlock_mux (shared) and
#     redlock_mux::redlock_mux_static
#
# Usage: bash capi/install.sh [--prefix DIR] [--libdir DIR] [--includedir DIR]
#                             [--target TRIPLE] [--profile NAME] [--target-dir DIR]
#                             [--library-type both|staticlib|cdylib] [--features tls]
#
#   --prefix        default /usr/local; LIBDIR is PREFIX/lib, INCLUDEDIR PREFIX/include
#   --target        a Rust target triple, to cross-build (its linker set as cargo wants it)
#   --profile       the cargo profile, default release
#   --library-type  what to build and install, default both; the header, the .pc and the
#                   CMake package always
#   --features      cargo features of the C library: `tls` for rediss:// nodes (rustls)
#
# DESTDIR, when set, goes before every path written (for packagers); the .pc still names the
# prefix. After installing into a system prefix, run ldconfig. The CMake package finds the
# prefix from its own location, so a prefix moved elsewhere works as it is; so does the .pc
# with `pkg-config --define-prefix`. Needs cargo, and nothing else beyond coreutils.
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
    -h | --help) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
minor="${version#*.}"
minor="${minor%%.*}"
# The ABI version, which the SONAME carries (as capi/build.rs sets it).
if [ "$major" = 0 ]; then abi="0.$minor"; else abi="$major"; fi

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

cmakedir="$libdir/cmake/redlock_mux"
run install -d "$DESTDIR$libdir/pkgconfig" "$DESTDIR$cmakedir" "$DESTDIR$includedir"
run install -m 644 include/redlock_mux.h "$DESTDIR$includedir/redlock_mux.h"
if [ "$library_type" != cdylib ]; then
    run install -m 644 "$built/libredlock_mux.a" "$DESTDIR$libdir/libredlock_mux.a"
fi
if [ "$library_type" != staticlib ]; then
    run install -m 755 "$built/libredlock_mux.so" "$DESTDIR$libdir/libredlock_mux.so.$version"
    run ln -sf "libredlock_mux.so.$version" "$DESTDIR$libdir/libredlock_mux.so.$abi"
    run ln -sf "libredlock_mux.so.$version" "$DESTDIR$libdir/libredlock_mux.so"
fi

# Libs.private: what rustc says a static link needs, less what every C compiler driver links
# on its own: libc, and the unwinder (libgcc_s, or libgcc_eh with -static, which has no
# libgcc_s to link).
pc="$DESTDIR$libdir/pkgconfig/redlock_mux.pc"
config="$DESTDIR$cmakedir/redlock_muxConfig.cmake"
config_version="$DESTDIR$cmakedir/redlock_muxConfigVersion.cmake"
if [ "$library_type" = cdylib ] && [ -f "$pc" ] && [ -f "$config" ] && [ -f "$config_version" ]; then
    exit 0 # the static library's install wrote them, with its Libs.private
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

# The CMake package. Its paths are relative to the file's own location whenever LIBDIR and
# INCLUDEDIR are under the prefix, so that the prefix may move; absolute otherwise.
cmake_private=""
for lib in $private; do
    case "$lib" in
    -l*) cmake_private="${cmake_private:+$cmake_private;}${lib#-l}" ;;
    *) cmake_private="${cmake_private:+$cmake_private;}$lib" ;;
    esac
done
pointer_bytes=$(($(rustc --print cfg ${target:+--target "$target"} |
    sed -n 's/^target_pointer_width="\([0-9]*\)"$/\1/p') / 8))
case "$libdir" in
"$prefix"/*)
    up=..
    rest="${libdir#"$prefix"/}/cmake"
    while [ -n "$rest" ] && [ "$rest" != . ]; do
        up="$up/.."
        case "$rest" in */*) rest="${rest#*/}" ;; *) rest="" ;; esac
    done
    cmake_prefix="\${CMAKE_CURRENT_LIST_DIR}/$up"
    cmake_libdir="\${_redlock_mux_prefix}/${libdir#"$prefix"/}"
    ;;
*)
    cmake_prefix="$prefix"
    cmake_libdir="$libdir"
    ;;
esac
case "$includedir" in
"$prefix"/*) cmake_includedir="\${_redlock_mux_prefix}/${includedir#"$prefix"/}" ;;
*) cmake_includedir="$includedir" ;;
esac
echo "+ write $config"
cat >"$config" <<CMAKE
# The C library of redlock-mux $version, as capi/install.sh installed it.
#
#   find_package(redlock_mux $major.$minor CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE redlock_mux::redlock_mux)        # the shared library
#   target_link_libraries(app PRIVATE redlock_mux::redlock_mux_static) # the static library
#
# Each target exists when its library is installed; the components \`shared\` and \`static\`
# require one (find_package(redlock_mux CONFIG REQUIRED COMPONENTS static)). The static target
# carries the system libraries a static link needs (the .pc's Libs.private). Paths are found
# from this file's location: a prefix moved elsewhere works as it is.
get_filename_component(_redlock_mux_prefix "$cmake_prefix" ABSOLUTE)
set(_redlock_mux_libdir "$cmake_libdir")
set(_redlock_mux_includedir "$cmake_includedir")
set(redlock_mux_INCLUDE_DIRS "\${_redlock_mux_includedir}")

set(redlock_mux_shared_FOUND FALSE)
if(EXISTS "\${_redlock_mux_libdir}/libredlock_mux.so.$version")
    set(redlock_mux_shared_FOUND TRUE)
    if(NOT TARGET redlock_mux::redlock_mux)
        add_library(redlock_mux::redlock_mux SHARED IMPORTED)
        set_target_properties(redlock_mux::redlock_mux PROPERTIES
            IMPORTED_LOCATION "\${_redlock_mux_libdir}/libredlock_mux.so.$version"
            IMPORTED_SONAME "libredlock_mux.so.$abi"
            INTERFACE_INCLUDE_DIRECTORIES "\${_redlock_mux_includedir}")
    endif()
endif()

set(redlock_mux_static_FOUND FALSE)
if(EXISTS "\${_redlock_mux_libdir}/libredlock_mux.a")
    set(redlock_mux_static_FOUND TRUE)
    if(NOT TARGET redlock_mux::redlock_mux_static)
        add_library(redlock_mux::redlock_mux_static STATIC IMPORTED)
        set_target_properties(redlock_mux::redlock_mux_static PROPERTIES
            IMPORTED_LOCATION "\${_redlock_mux_libdir}/libredlock_mux.a"
            IMPORTED_LINK_INTERFACE_LANGUAGES C
            INTERFACE_INCLUDE_DIRECTORIES "\${_redlock_mux_includedir}"
            INTERFACE_LINK_LIBRARIES "$cmake_private")
    endif()
endif()

if(NOT redlock_mux_shared_FOUND AND NOT redlock_mux_static_FOUND)
    set(redlock_mux_FOUND FALSE)
    set(redlock_mux_NOT_FOUND_MESSAGE
        "neither libredlock_mux.so.$version nor libredlock_mux.a is in \${_redlock_mux_libdir}")
endif()
foreach(_redlock_mux_component IN LISTS redlock_mux_FIND_COMPONENTS)
    if(NOT _redlock_mux_component MATCHES "^(shared|static)\$")
        set(redlock_mux_\${_redlock_mux_component}_FOUND FALSE)
    endif()
    if(redlock_mux_FIND_REQUIRED_\${_redlock_mux_component}
       AND NOT redlock_mux_\${_redlock_mux_component}_FOUND)
        set(redlock_mux_FOUND FALSE)
        set(redlock_mux_NOT_FOUND_MESSAGE
            "the component \${_redlock_mux_component} (shared or static) is not in \${_redlock_mux_libdir}")
    endif()
endforeach()
unset(_redlock_mux_component)
unset(_redlock_mux_prefix)
unset(_redlock_mux_libdir)
unset(_redlock_mux_includedir)
CMAKE

# Which requests this version satisfies: before 1.0 the same 0.MINOR (whose SONAME it has) at
# this patch or below, from 1.0 on the same MAJOR at this version or below; and only for a
# project whose pointers are as wide as the library's.
echo "+ write $config_version"
cat >"$config_version" <<CMAKE
# The version of the C library of redlock-mux, for find_package(redlock_mux VERSION CONFIG).
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION_RANGE)
    # A range: accepted when this version is in it and has the ABI of its lower end.
    set(_redlock_mux_wanted "\${PACKAGE_FIND_VERSION_MIN}")
else()
    set(_redlock_mux_wanted "\${PACKAGE_FIND_VERSION}")
endif()
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT _redlock_mux_wanted)
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(NOT PACKAGE_VERSION VERSION_LESS _redlock_mux_wanted)
    string(REGEX MATCH "^[0-9]+" _redlock_mux_major "\${_redlock_mux_wanted}")
    string(REGEX MATCH "^[0-9]+\\\\.([0-9]+)" _redlock_mux_minor "\${_redlock_mux_wanted}.0")
    set(_redlock_mux_minor "\${CMAKE_MATCH_1}")
    if("$major" STREQUAL "0")
        if(_redlock_mux_major STREQUAL "0" AND _redlock_mux_minor STREQUAL "$minor")
            set(PACKAGE_VERSION_COMPATIBLE TRUE)
        endif()
    elseif(_redlock_mux_major STREQUAL "$major")
        set(PACKAGE_VERSION_COMPATIBLE TRUE)
    endif()
    if(PACKAGE_VERSION_COMPATIBLE AND PACKAGE_FIND_VERSION_RANGE)
        if((PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "INCLUDE"
            AND PACKAGE_VERSION VERSION_GREATER PACKAGE_FIND_VERSION_MAX)
           OR (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "EXCLUDE"
            AND NOT PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION_MAX))
            set(PACKAGE_VERSION_COMPATIBLE FALSE)
        endif()
    endif()
    if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
        set(PACKAGE_VERSION_EXACT TRUE)
    endif()
endif()
unset(_redlock_mux_wanted)
unset(_redlock_mux_major)
unset(_redlock_mux_minor)
# A library for $((pointer_bytes * 8))-bit pointers.
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P STREQUAL "$pointer_bytes")
    math(EXPR _redlock_mux_bits "\${CMAKE_SIZEOF_VOID_P} * 8")
    set(PACKAGE_VERSION "\${PACKAGE_VERSION} ($((pointer_bytes * 8))-bit, not \${_redlock_mux_bits}-bit)")
    set(PACKAGE_VERSION_UNSUITABLE TRUE)
    unset(_redlock_mux_bits)
endif()
CMAKE
