//! `redlock-mux`: run a command under a Redlock lock, benchmark lock latency, inspect a lock.
//!
//! Commands:
//! - `run`: hold a lock while a command runs, extending it in the background;
//! - `bench`: lock latency against local `redis-server` processes it starts, next to a
//!   hand-written baseline measured in the same run;
//! - `inspect`: what each node holds for a key.
//!
//! Every command has `--help`. Usage errors exit 64; `run` documents its other statuses.
#![forbid(unsafe_code)]

mod args;
mod bench;
mod inspect;
#[path = "../../tests/common/local_servers.rs"]
mod local_servers;
mod node;
mod run;
mod stats;

use std::fmt;

use args::{UsageError, EXIT_USAGE};

const HELP: &str = "\
redlock-mux: Redlock distributed locks over N Redis masters

Usage: redlock-mux <COMMAND> [OPTIONS]

Commands:
  run      acquire a lock, run a command while holding it, release it
  bench    lock latency against local redis-server instances it starts
  inspect  show what each node holds for a key

Nodes are given with --nodes URL,URL,... or the REDLOCK_NODES variable.
Durations are written like 250ms, 10s or 2m.
Run `redlock-mux <COMMAND> --help` for a command's options.
";

/// Why a command stopped: its exit status and the message for stderr.
#[derive(Debug)]
pub struct Fail {
    /// The exit status.
    pub code: i32,
    /// What to print on stderr.
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

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let rest = argv.get(1..).unwrap_or(&[]);
    let result = match argv.first().map(String::as_str) {
        Some("run") => run::main(rest),
        Some("bench") => bench::main(rest),
        Some("inspect") => inspect::main(rest),
        Some("-h" | "--help" | "help") => {
            print!("{HELP}");
            Ok(0)
        }
        Some(other) => Err(Fail::from(args::usage!("unknown command {other:?}"))),
        None => {
            eprint!("{HELP}");
            Err(Fail::from(args::usage!("no command given")))
        }
    };
    let code = match result {
        Ok(code) => code,
        Err(fail) => {
            eprintln!("redlock-mux: {fail}");
            fail.code
        }
    };
    std::process::exit(code);
}
