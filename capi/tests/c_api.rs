//! The C API as C programs use it: the programs in `tests/c/` are compiled with `cc` (or `$CC`)
//! against the static library and `include/redlock_mux.h`, and run against real redis-server
//! processes started here. One run is under valgrind's memcheck.
//!
//! The static library is this package's `libredlock_mux.a`, which the test builds with cargo
//! (same profile and features) before the first C program; `REDLOCK_MUX_STATICLIB` may name
//! another one.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux_kit::assert_settles_eq;
use redlock_mux_kit::local_servers::*;
use redlock_mux_kit::probe::*;

/// What `rustc --print native-static-libs` lists for this library on glibc.
const NATIVE_LIBS: &[&str] = &["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl"];

/// The workspace's root, where `include/` and `tests/c/` are.
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn staticlib() -> PathBuf {
    if let Some(path) = std::env::var_os("REDLOCK_MUX_STATICLIB") {
        return PathBuf::from(path);
    }
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_staticlib).clone()
}

/// Builds this package's static library with the profile and features of this test run, and
/// returns its path. `cargo test` builds the integration tests of a package whose library is
/// only a `staticlib`/`cdylib` without building that library, so a fresh checkout has none;
/// an up-to-date library costs one quick `cargo build`.
fn build_staticlib() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    // target/<profile>/deps/c_api-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable is in target/<profile>/deps");
    let target_dir = profile_dir
        .parent()
        .expect("the profile directory is in the target directory");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "-p", "redlock-mux-capi", "--lib"])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(root());
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    if cfg!(feature = "tls") {
        build.args(["--features", "tls"]);
    }
    let status = build
        .status()
        .expect("run cargo to build the static library");
    assert!(status.success(), "cargo build -p redlock-mux-capi failed");
    let lib = profile_dir.join("libredlock_mux.a");
    assert!(
        lib.exists(),
        "{} is missing after cargo build -p redlock-mux-capi; set REDLOCK_MUX_STATICLIB",
        lib.display()
    );
    lib
}

/// Compiles `tests/c/<name>.c` into a fresh executable (named after `tag`, so that tests
/// running in parallel do not share one) and returns its path.
fn compile(name: &str, tag: &str) -> PathBuf {
    compile_with(name, tag, &[])
}

/// As `compile`, with more compiler flags (given before the sources, so that they apply to the
/// link too).
fn compile_with(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-api");
    std::fs::create_dir_all(&out_dir).expect("create the output directory");
    let exe = out_dir.join(format!("{name}-{tag}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let output = Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-g",
            "-O1",
        ])
        .args(flags)
        .arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(root().join("tests/c"))
        .arg(root().join("tests/c").join(format!("{name}.c")))
        .arg(staticlib())
        .args(NATIVE_LIBS)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e} (install a C compiler: bash .ci/install)"));
    assert!(
        output.status.success(),
        "{cc} failed on {name}.c:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

fn show(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs to completion, killing the program after `limit`.
fn run_bounded(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the C program");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("poll the C program").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reap the C program");
            panic!(
                "the C program ran for more than {limit:?}:\n{}",
                show(&output)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
    child
        .wait_with_output()
        .expect("collect the C program's output")
}

#[test]
fn c_api_tests_pass() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("api_test", "plain");
    let mut command = Command::new(exe);
    command.args(cluster.urls());
    let output = run_bounded(command, Duration::from_secs(60));
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{}", show(&output));
    // Everything the C tests locked, they released (or freed, which releases). Only the
    // fenced locks' counters stay, as they must: they never expire. A release returns once a
    // quorum has answered, so the last node may still be applying it: give it a moment.
    for addr in cluster.addrs() {
        let fenced = |k: &Vec<u8>| k.starts_with(b"redlock-mux:fence:");
        eventually(Duration::from_secs(3), || keys(addr).iter().all(fenced));
        let (counters, left): (Vec<Vec<u8>>, Vec<Vec<u8>>) =
            keys(addr).into_iter().partition(fenced);
        assert_eq!(left, Vec::<Vec<u8>>::new(), "keys left on {addr}");
        // Fenced mutexes on four keys, fenced write locks on four resources: each has its
        // own counter.
        assert_eq!(counters.len(), 8, "eight fence counters on {addr}");
    }
}

#[test]
fn c_api_tests_pass_under_valgrind() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("api_test", "valgrind");
    let mut command = Command::new("valgrind");
    command
        .args([
            "--tool=memcheck",
            "--error-exitcode=1",
            "--leak-check=full",
            "--show-leak-kinds=definite,indirect,possible",
            "--errors-for-leak-kinds=definite,indirect,possible",
        ])
        .arg(format!(
            "--suppressions={}",
            root().join("tests/c/valgrind.supp").display()
        ))
        .arg(exe)
        .args(cluster.urls());
    let output = run_bounded(command, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "valgrind found errors or leaks (install it with bash .ci/install):\n{}",
        show(&output)
    );
    assert!(
        stderr.contains("ERROR SUMMARY: 0 errors"),
        "{}",
        show(&output)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(" passed, 0 failed"),
        "{}",
        show(&output)
    );
}

/// The C programs built with AddressSanitizer and UndefinedBehaviorSanitizer
/// (`-fsanitize=address,undefined`, with `cc` or `$CC`: gcc or clang), linked against the static
/// library: every allocation of the library goes through the instrumented malloc, so a handle
/// freed twice, a buffer overrun in C, a leak at exit (LeakSanitizer) or undefined behaviour in
/// the programs fails the run. The library's Rust code is not instrumented; valgrind covers it
/// (above).
#[test]
fn c_programs_pass_under_address_and_undefined_behavior_sanitizers() {
    const SANITIZE: &[&str] = &[
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
    ];
    let cluster = RedisCluster::start(3).expect("start redis-server");
    for name in ["api_test", "example", "fork"] {
        let exe = compile_with(name, "sanitizers", SANITIZE);
        let mut command = Command::new(exe);
        if name == "fork" {
            let marker = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("fork-marker-sanitizers-{}", std::process::id()));
            let _ = std::fs::remove_file(&marker);
            command.arg(marker);
        }
        command
            .args(cluster.urls())
            .env("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1:exitcode=99")
            .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1");
        let output = run_bounded(command, Duration::from_secs(120));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && !stderr.contains("Sanitizer"),
            "{name}.c under -fsanitize=address,undefined:\n{}",
            show(&output)
        );
        if name == "api_test" {
            assert!(
                String::from_utf8_lossy(&output.stdout).contains(" passed, 0 failed"),
                "{}",
                show(&output)
            );
        }
    }
}

#[test]
fn c_example_locks_extends_and_releases() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("example", "example");
    let mut command = Command::new(exe);
    command.args(cluster.urls());
    let output = run_bounded(command, Duration::from_secs(30));
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", show(&output));
    assert!(
        lines[0].starts_with("locked invoice:42 with token "),
        "{stdout}"
    );
    assert!(lines[1].starts_with("extended, valid for "), "{stdout}");
    assert_eq!(lines[2], "released");
    for addr in cluster.addrs() {
        assert_settles_eq!(get(addr, b"invoice:42"), None, "lock left on {addr}");
    }
}

#[test]
fn c_example_over_unix_sockets() {
    let dir = std::env::temp_dir().join(format!("rlm-capi-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the sockets");
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    for i in 0..3 {
        let socket = dir.join(format!("{i}.sock"));
        let path = socket.to_str().unwrap();
        let server = RedisServer::start_with(&["--unixsocket", path, "--requirepass", "pw"])
            .expect("start redis-server with --unixsocket");
        urls.push(format!("unix://{path}?db=1&pass=pw"));
        servers.push(server);
    }
    let exe = compile("example", "unix");
    let mut command = Command::new(exe);
    command.args(&urls);
    let output = run_bounded(command, Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("locked invoice:42 with token "),
        "{stdout}"
    );
    assert!(stdout.ends_with("released\n"), "{stdout}");
}

#[test]
fn two_c_processes_contend_for_one_lock() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("contend", "contend");
    let key = "c-contended";
    let command = |mode: &str| {
        let mut c = Command::new(&exe);
        c.arg(mode).arg(key).args(cluster.urls());
        c
    };

    // Process A takes the lock and holds it until told to release.
    let mut holder = command("hold")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the holder");
    let mut holder_out = BufReader::new(holder.stdout.take().expect("holder stdout"));
    let mut line = String::new();
    holder_out.read_line(&mut line).expect("read the holder");
    let token = line
        .strip_prefix("locked ")
        .unwrap_or_else(|| panic!("the holder said {line:?}"))
        .trim()
        .to_owned();
    for addr in cluster.addrs() {
        assert_settles_eq!(get(addr, key.as_bytes()), Some(token.clone().into_bytes()));
    }

    // Process B's single attempt is refused with REDLOCK_MUX_CONTENDED (3).
    let refused = run_bounded(command("try"), Duration::from_secs(30));
    assert_eq!(refused.status.code(), Some(3), "{}", show(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("held elsewhere"),
        "{}",
        show(&refused)
    );

    // Process C waits; A's release lets it in.
    let mut waiter = command("wait")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the waiter");
    thread::sleep(Duration::from_millis(200));
    assert!(
        waiter.try_wait().expect("poll the waiter").is_none(),
        "the waiter finished while the lock was held"
    );
    let mut stdin = holder.stdin.take().expect("holder stdin");
    stdin.write_all(b"release\n").expect("tell the holder");
    drop(stdin);
    line.clear();
    holder_out.read_line(&mut line).expect("read the holder");
    assert_eq!(line, "released\n");
    assert!(holder.wait().expect("reap the holder").success());

    let deadline = Instant::now() + Duration::from_secs(15);
    while waiter.try_wait().expect("poll the waiter").is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    if waiter.try_wait().expect("poll the waiter").is_none() {
        let _ = waiter.kill();
    }
    let waited = waiter.wait_with_output().expect("reap the waiter");
    assert!(waited.status.success(), "{}", show(&waited));
    let stdout = String::from_utf8_lossy(&waited.stdout);
    let got = stdout
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("locked "))
        .unwrap_or_else(|| panic!("{}", show(&waited)));
    assert_ne!(got, token, "the waiter must hold its own token");
    for addr in cluster.addrs() {
        assert_settles_eq!(get(addr, key.as_bytes()), None, "lock left on {addr}");
    }
}

/// A client used on both sides of `fork()` (see `tests/c/fork.c`): each process opens its
/// own connections, so neither reads the other's replies, and they never hold the lock at once.
#[test]
fn a_client_used_after_fork_opens_its_own_connections() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("fork", "fork");
    let marker =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fork-marker-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let mut command = Command::new(exe);
    command.arg(&marker).args(cluster.urls());
    let output = run_bounded(command, Duration::from_secs(30));
    assert!(output.status.success(), "{}", show(&output));
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));
}

/// A child never releases its parent's locks (see `tests/c/fork_inherit.c`): freeing or
/// releasing an inherited handle leaves the lock its parent's.
#[test]
fn a_child_freeing_inherited_locks_leaves_them_to_its_parent() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = compile("fork_inherit", "fork_inherit");
    let mut command = Command::new(exe);
    command.args(cluster.urls());
    let output = run_bounded(command, Duration::from_secs(30));
    assert!(output.status.success(), "{}", show(&output));
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));
}
