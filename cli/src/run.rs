//! `redlock-mux run`: hold a lock while a command runs.
//!
//! The lock is kept alive by the library's keeper thread while the command runs, released
//! when it exits, and the command's exit status becomes ours. A lost lock stops the command
//! (SIGTERM, then SIGKILL after a grace period) and exits 76.
//!
//! Signals: the crate makes no raw libc calls and depends on no signal-handling crate, so this
//! process cannot install a signal handler. Instead `run` first re-executes itself under
//! `sh`, which can: the shell (keeping our PID) traps INT and TERM and writes the signal's
//! name to a private file; the real `run` starts with INT and TERM ignored (a disposition
//! that survives `exec`), polls that file, and forwards the signal to the command. The
//! command is started through `env --default-signal` so that it gets the default handling
//! back. Without `sh`, `run` works unwrapped, and a signal to it ends it at once: the lock is
//! then not released, and expires after its TTL.
#![forbid(unsafe_code)]

use std::fs;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Client, Error, KeepAlive, Lost};

use crate::args::{self, usage, Spec};
use crate::Fail;

/// Exit status when the lock was not acquired within `--wait` (sysexits `EX_TEMPFAIL`).
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit status when the lock was lost while the command ran.
pub const EXIT_LOST: i32 = 76;
/// Exit status when a node refused the connection setup: a wrong password or user, a
/// database the server does not have, or an address that is not a Redis server's (sysexits
/// `EX_CONFIG`). It comes at once, without waiting out `--wait`.
pub const EXIT_CONFIG: i32 = 78;

/// Set for the wrapped `run`: where the wrapping shell writes the signals it caught.
const SIGNAL_FILE_ENV: &str = "REDLOCK_MUX_RUN_SIGNAL_FILE";
/// Set for the wrapped `run`: the PID of the wrapping shell.
const PARENT_ENV: &str = "REDLOCK_MUX_RUN_PARENT";
/// How often the command, the lock and the signal file are checked.
const POLL: Duration = Duration::from_millis(10);

const HELP: &str = "\
Usage: redlock-mux run [--nodes URLS] [--ttl 30s] [--wait 10s] [--grace 10s]
                       [--read|--write] [--fair] KEY -- CMD [ARGS...]

Acquires the lock on KEY, runs CMD while extending the lock in the background
(every TTL/3), releases the lock when CMD exits, and exits with CMD's status
(128 + N when CMD was killed by signal N).

  exit 75   the lock was not acquired within --wait
  exit 76   the lock was lost while CMD ran; CMD got SIGTERM, and SIGKILL after
            the grace period
  exit 78   a node refused the connection setup (wrong password or user, a
            database the server does not have, not a Redis server); reported
            at once, without waiting
  exit 64   usage error;  126/127: CMD could not be started / was not found

INT and TERM sent to redlock-mux are passed to CMD; the lock is released when
CMD exits.

Options:
  --nodes URLS   comma-separated redis:// URLs (default: $REDLOCK_NODES)
  --ttl D        lock TTL (default 30s)
  --wait D       how long to wait for the lock (default 10s)
  --grace D      time between SIGTERM and SIGKILL when the lock is lost
                 (default 10s)
  --read         take a shared read lock: other `--read` runs on KEY may
                 hold it at the same time, `--write` runs and mutex runs not
  --write        take the exclusive write lock of KEY's read-write lock
                 (it excludes `--read` and other `--write` runs, not mutex runs)
  --fair         wait in a first-come, first-served queue (readers at its head share)
                 (not with --read or --write)
  -h, --help     this text
Durations are written like 250ms, 10s or 2m.
";

/// Entry point of `redlock-mux run`.
pub fn main(argv: &[String]) -> Result<i32, Fail> {
    let spec = Spec {
        options: &["nodes", "ttl", "wait", "grace"],
        switches: &["read", "write", "fair"],
        takes_command: true,
    };
    let Some(parsed) = args::parse_command(&spec, argv, HELP)? else {
        return Ok(0);
    };
    let key = parsed.key()?;
    if parsed.command.is_empty() {
        return Err(usage!("no command given after `--`").into());
    }
    let ttl = parsed.duration("ttl", Duration::from_secs(30))?;
    let wait = parsed.duration("wait", Duration::from_secs(10))?;
    let grace = parsed.duration("grace", Duration::from_secs(10))?;
    let nodes = args::nodes(&parsed)?;
    if parsed.switch("read") && parsed.switch("write") {
        return Err(usage!("give --read or --write, not both").into());
    }
    let kind = match (parsed.switch("read"), parsed.switch("write")) {
        (true, _) => Kind::Read,
        (_, true) => Kind::Write,
        _ => Kind::Mutex,
    };
    let fair = parsed.switch("fair");

    let signal_file = match std::env::var_os(SIGNAL_FILE_ENV) {
        Some(path) => Some(PathBuf::from(path)),
        // Does not return when the shell could be started.
        None => reexec_under_shell(argv),
    };

    let client = Client::builder()
        .nodes(&nodes)
        .wait_timeout(wait)
        .retry_count(u32::MAX)
        .fair(fair)
        .build()
        .map_err(|e| Fail {
            code: if e.is_config() {
                EXIT_CONFIG
            } else {
                args::EXIT_USAGE
            },
            message: e.to_string(),
        })?;
    let (lost_tx, lost_rx) = mpsc::channel();
    let keep = KeepAlive::new(ttl).notify(lost_tx);
    let acquired = match kind {
        Kind::Mutex => client.lock(&key, ttl).and_then(|l| Ok(l.keep_alive(keep)?)),
        Kind::Read => client
            .read_lock(&key, ttl)
            .and_then(|l| Ok(l.keep_alive(keep)?)),
        Kind::Write => client
            .write_lock(&key, ttl)
            .and_then(|l| Ok(l.keep_alive(keep)?)),
    };
    let kept = match acquired {
        Ok(kept) => kept,
        Err(e @ Error::InvalidArgument(_)) => {
            return Err(Fail {
                code: args::EXIT_USAGE,
                message: e.to_string(),
            })
        }
        Err(e @ Error::Config { .. }) => {
            return Err(Fail {
                code: EXIT_CONFIG,
                message: format!("lock {key:?} not acquired: {e}"),
            })
        }
        Err(e) => {
            return Err(Fail {
                code: EXIT_NOT_ACQUIRED,
                message: format!("lock {key:?} not acquired within {wait:?}: {e}"),
            })
        }
    };

    let mut child = match spawn(&parsed.command) {
        Ok(child) => child,
        Err(e) => {
            let _ = kept.release();
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(Fail {
                code,
                message: format!("could not start {:?}: {e}", parsed.command[0]),
            });
        }
    };
    let outcome = supervise(&mut child, &lost_rx, signal_file.as_deref(), grace);
    if let Some(path) = &signal_file {
        let _ = fs::remove_file(path);
    }
    match outcome {
        Ok(Supervised::Exited(status)) => {
            if let Err(e) = kept.release() {
                eprintln!("redlock-mux: releasing {key:?} failed (it expires by itself): {e}");
            }
            Ok(exit_code(status))
        }
        Ok(Supervised::Lost(lost)) => {
            let _ = kept.release();
            Err(Fail {
                code: EXIT_LOST,
                message: format!(
                    "lock {key:?} lost while the command ran, command stopped: {}",
                    lost.error
                ),
            })
        }
        Err(e) => {
            let _ = kept.release();
            Err(Fail::other(format!("waiting for the command failed: {e}")))
        }
    }
}

/// Which lock `run` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
}

/// Replaces this process with `sh` running a copy of it, so that the process the caller
/// knows can catch INT and TERM (see the module docs). Returns only if that failed, with no
/// signal file: `run` then goes on unwrapped.
fn reexec_under_shell(argv: &[String]) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let file = std::env::temp_dir().join(format!(
        "redlock-mux-run-{}-{nanos}.signal",
        std::process::id()
    ));
    // $1: signal file, $2: our executable, the rest: `run`'s arguments. The copy runs in the
    // background with INT and TERM ignored, and stdin passed on through fd 3 (an asynchronous
    // list would otherwise read /dev/null). `wait` returns early when a trap runs; a
    // zombie still answers `kill -0`, so the loop ends only once the copy was reaped.
    const SCRIPT: &str = r#"f=$1; shift
trap 'echo INT >> "$f"' INT
trap 'echo TERM >> "$f"' TERM
exec 3<&0
( trap '' INT TERM; REDLOCK_MUX_RUN_PARENT=$$ exec "$@" ) <&3 3<&- &
w=$!
exec 3<&-
rc=0
while kill -0 "$w" 2>/dev/null; do wait "$w"; rc=$?; done
wait "$w" 2>/dev/null; r=$?; [ "$r" -eq 127 ] || rc=$r
rm -f "$f"
exit "$rc""#;
    let err = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("sh")
        .arg(&file)
        .arg(exe)
        .arg("run")
        .args(argv)
        .env(SIGNAL_FILE_ENV, &file)
        .exec();
    eprintln!(
        "redlock-mux: cannot start sh to catch signals ({err}); INT and TERM will not be passed on"
    );
    None
}

/// Starts the command, with default handling of the signals the wrapping shell ignored.
fn spawn(command: &[String]) -> io::Result<Child> {
    let mut cmd = if env_resets_signals() {
        let mut c = Command::new("env");
        c.arg("--default-signal=INT,TERM,QUIT")
            .arg("--")
            .args(command);
        c
    } else {
        let mut c = Command::new(&command[0]);
        c.args(&command[1..]);
        c
    };
    cmd.env_remove(SIGNAL_FILE_ENV)
        .env_remove(PARENT_ENV)
        .stdin(Stdio::inherit());
    if env_resets_signals() {
        // `env` reports a missing command as exit 127 itself; check first for a clear error.
        if !command[0].contains('/') && find_in_path(&command[0]).is_none() {
            return Err(io::ErrorKind::NotFound.into());
        }
    }
    cmd.spawn()
}

/// Whether `env --default-signal` (GNU coreutils 8.31 and later) is available.
fn env_resets_signals() -> bool {
    use std::sync::OnceLock;
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        std::env::var_os(SIGNAL_FILE_ENV).is_some()
            && Command::new("env")
                .args(["--default-signal=INT", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

enum Supervised {
    Exited(ExitStatus),
    Lost(Lost),
}

/// Waits for the command, forwarding caught signals, and stops it if the lock is lost.
///
/// When wrapped, a change of parent means the wrapping shell (the process the caller knows)
/// was killed outright, say by SIGKILL: the command is stopped as for a lost lock, so that it
/// does not go on running while nobody answers for the lock, which is then released.
fn supervise(
    child: &mut Child,
    lost: &mpsc::Receiver<Lost>,
    signal_file: Option<&std::path::Path>,
    grace: Duration,
) -> io::Result<Supervised> {
    let parent = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Supervised::Exited(status));
        }
        if let Ok(notice) = lost.try_recv() {
            eprintln!(
                "redlock-mux: lock lost ({}); sending SIGTERM to the command",
                notice.error
            );
            stop(child, grace)?;
            return Ok(Supervised::Lost(notice));
        }
        if let Some(path) = signal_file {
            if parent.is_some_and(|p| p != std::os::unix::process::parent_id()) {
                let status = stop(child, grace)?;
                return Ok(Supervised::Exited(status));
            }
            if let Ok(caught) = fs::read_to_string(path) {
                let _ = fs::remove_file(path);
                for name in caught.split_whitespace() {
                    if name == "INT" || name == "TERM" {
                        signal(child.id(), name);
                    }
                }
            }
        }
        thread::sleep(POLL);
    }
}

/// SIGTERM, then SIGKILL if the command still runs after `grace`.
fn stop(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    signal(child.id(), "TERM");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        thread::sleep(POLL);
    }
    eprintln!("redlock-mux: the command outlived the grace period; sending SIGKILL");
    let _ = child.kill();
    child.wait()
}

/// Sends signal `name` to `pid` with the `kill` program (no raw libc call here).
///
/// A command started through `env --default-signal` ignores INT and TERM until `env` has
/// reset them; a signal sent in that window would be lost. On Linux the signal waits (at
/// most a second) until `/proc/PID/status` shows it is no longer ignored.
fn signal(pid: u32, name: &str) {
    let number = if name == "INT" { 2 } else { 15 };
    let deadline = Instant::now() + Duration::from_secs(1);
    while ignores(pid, number) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether `pid` is known to ignore signal `number`; false where that cannot be told.
fn ignores(pid: u32, number: u32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (number - 1)) != 0)
}

/// The shell's convention: the exit code, or 128 + the signal that killed the command.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
