//! `redlock-mux`: run a command under a Redlock lock, inspect a lock, benchmark lock latency.
//!
//! Commands:
//! - `run`: a distributed flock(1): hold a lock while a command runs, extending it in the
//!   background, and supervise the command (signals passed on, stopped when the lock is lost,
//!   never left running without `run`);
//! - `inspect`: what each node holds for a key;
//! - `bench`: lock latency against given nodes or local `redis-server` processes it starts,
//!   next to a raw baseline measured in the same run.
//!
//! Every command has `--help`. Usage errors exit 64; each command documents its other
//! statuses. The library is used in few places: `lock.rs` (run), `bench.rs`, and the URL
//! parser in `node.rs`.

mod args;
mod bench;
mod inspect;
mod lock;
mod node;
mod run;
mod spawn;
mod supervise;
#[cfg(feature = "tls")]
mod tls;

#[cfg(feature = "tls")]
use redlock_mux_kit::pki;
use redlock_mux_kit::{local_servers, raw, stats};
use std::fmt;
use std::io::{self, Write};

use args::{UsageError, EXIT_USAGE};

const HELP: &str = "\
redlock-mux: Redlock distributed locks over N Redis masters

Usage: redlock-mux <COMMAND> [OPTIONS]

Commands:
  run      acquire a lock, run a command while holding it, release it
           (a distributed flock(1))
  inspect  show what each node holds for a key
  bench    lock latency against given nodes or local redis-server instances

Options:
  -h, --help     this text
  -V, --version  the version

Nodes are given with --nodes URL,URL,... or the REDLOCK_NODES variable, as
redis://[user:password@]host:port[/db] or host:port; a Redis Cluster as
redis+cluster://host:port[,host:port...]; a master managed by Redis Sentinel as
redis+sentinel://host:port[,host:port...]/SERVICE[?sentinel_password=P]
(see the README for every form and ?wait=N).
Durations are written like 250ms, 10s or 2m.
Run `redlock-mux <COMMAND> --help` for a command's options and exit statuses.
";

/// Why a command stopped: its exit status and the message for stderr.
#[derive(Debug)]
pub struct Fail {
    /// The exit status.
    pub code: i32,
    /// What to print on stderr; nothing when empty.
    pub message: String,
}

impl Fail {
    /// A runtime failure (exit 1).
    pub fn other(message: String) -> Fail {
        Fail { code: 1, message }
    }
}

impl From<UsageError> for Fail {
    fn from(e: UsageError) -> Fail {
        Fail {
            code: EXIT_USAGE,
            message: format!("{e}\n(see --help)"),
        }
    }
}

impl From<lexopt::Error> for Fail {
    fn from(e: lexopt::Error) -> Fail {
        UsageError::from(e).into()
    }
}

/// A failed write to stdout. A reader that went away (`redlock-mux bench | head`) ends the
/// command quietly with status 0, as it does for `cat` or `grep` in a pipeline; any other
/// error is reported.
impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        if e.kind() == io::ErrorKind::BrokenPipe {
            Fail {
                code: 0,
                message: String::new(),
            }
        } else {
            Fail::other(format!("cannot write the output: {e}"))
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Writes `text` to stdout (help, version), quietly if nobody reads it.
pub fn print_text(text: &str) -> Result<i32, Fail> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(0)
}

fn main() {
    let mut argv = std::env::args_os().skip(1);
    let command = argv.next();
    let rest: Vec<std::ffi::OsString> = argv.collect();
    let result = match command.as_ref().and_then(|c| c.to_str()) {
        Some("run") => run::main(rest),
        Some("bench") => bench::main(rest),
        Some("inspect") => inspect::main(rest),
        Some("-h" | "--help" | "help") => print_text(HELP),
        Some("-V" | "--version") => {
            print_text(&format!("redlock-mux {}\n", env!("CARGO_PKG_VERSION")))
        }
        Some(other) => Err(Fail::from(args::usage!("unknown command {other:?}"))),
        None if command.is_some() => Err(Fail::from(args::usage!("unknown command {command:?}"))),
        None => {
            eprint!("{HELP}");
            Err(Fail::from(args::usage!("no command given")))
        }
    };
    let code = match result {
        Ok(code) => code,
        Err(fail) => {
            if !fail.message.is_empty() {
                let _ = writeln!(io::stderr(), "redlock-mux: {fail}");
            }
            fail.code
        }
    };
    std::process::exit(code);
}
