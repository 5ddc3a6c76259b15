//! `redlock-mux run`: a distributed flock(1). Hold a lock while a command runs, under
//! supervision (see [`supervise`](crate::supervise)).

use std::ffi::OsString;
use std::io;
use std::time::Duration;

use crate::args::{self, usage};
use crate::lock::{self, Kind, Request, EXIT_LOST, EXIT_NOT_ACQUIRED};
use crate::supervise::{self, Event};
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux run [OPTIONS] KEY [--] CMD [ARGS...]

Acquires the lock on KEY, runs CMD while the lock is extended in the
background (every TTL/3), and releases it once CMD, and every process left in
CMD's process group, has ended. As with flock(1), CMD may follow KEY
directly; `--` is only needed before a CMD that starts with `-`.

Options:
  --nodes URLS         comma-separated node URLs (default: $REDLOCK_NODES):
                       redis://[user:pass@]host[:port][/db], rediss://... (TLS),
                       unix:///path/to/redis.sock[?db=N&pass=P]
  --ttl D              lock TTL, kept alive while CMD runs (default 30s; at
                       least 600ms, so that it can be kept alive)
  -w, --wait D         how long to wait for the lock (default 10s); a bare
                       number is seconds, as for flock -w (5, 0.5)
  -n, --nonblock       do not wait: a single attempt (as -w 0)
  -E, --conflict-exit-code N
                       exit status when the lock is not acquired (default 75)
  --grace D            time between SIGTERM and SIGKILL when CMD must stop
                       (default 10s)
  --read               take a shared read lock: other --read runs on KEY may
                       hold it at the same time, --write runs not
  --write              take the exclusive write lock of KEY's read-write lock
                       (it excludes --read and other --write runs; the mutex,
                       taken without --read or --write, is another lock)
  --permits K          take one of K permits of KEY's counting semaphore: up
                       to K runs with --permits K on KEY hold it at the same
                       time (the semaphore is another lock than the mutex and
                       the read-write lock of KEY). Every run on KEY must give
                       the same K; one with another K exits 78. The quorum is
                       floor(K*N/(K+1))+1 of the N nodes, so that K+1 holders
                       are impossible: with K >= 2 and 3 nodes, every node
                       must be up
  --fair               wait in a first-come, first-served queue; with --read,
                       --write or --permits too (readers at the head of the
                       queue share the lock)
{TLS}  -h, --help           this text
Durations are written like 250ms, 10s or 2m.

Exit status:
  CMD's     CMD's own; 128 + N when CMD was killed by signal N
  75        the lock was not acquired within --wait (or at once, with -n);
            -E sets another status for this
  76        the lock was lost while CMD ran: CMD's process group got SIGTERM,
            and SIGKILL after the grace period
  78        a node refused the connection setup (wrong password or user, a
            database the server does not have, not a Redis server, a TLS
            certificate or port that does not fit the URL), or
            --permits differs from the K the semaphore on KEY was created
            with; reported at once, without waiting
  64        usage error, such as a --ttl too short to be kept alive, or
            --permits 0
  126, 127  CMD could not be started / was not found

CMD runs in a process group of its own, with default signal handling, an empty
signal mask, and REDLOCK_MUX_KEY and REDLOCK_MUX_TOKEN (the lock's token) in its
environment, for the resource the lock guards. When redlock-mux runs in the
foreground of a terminal, CMD's group gets the terminal (Ctrl-C and Ctrl-Z
reach CMD as they would without redlock-mux).

Signals: INT, TERM, HUP, QUIT, USR1 and USR2 sent to redlock-mux are passed on
to CMD's process group. Processes left in that group when CMD ends get SIGTERM
(and SIGKILL after the grace period) before the lock is released. If
redlock-mux itself is killed (SIGKILL), CMD's process group is killed at once
by a guardian process (sh), and on Linux CMD also by the kernel (the parent
death signal), so CMD never runs on without the lock.
";

/// Entry point of `redlock-mux run`.
pub fn main(argv: Vec<OsString>) -> Result<i32, Fail> {
    let Some((request, grace, command)) = parse(argv)? else {
        return Ok(0);
    };
    lock::check(&request)?;

    let (events, received) = supervise::channel();
    let on_lost = {
        let events = events.clone();
        move |why: String| {
            let _ = events.send(Event::Lost(why));
        }
    };
    // Signals keep their default action while the lock is awaited: INT or TERM then ends
    // `run` at once, with nothing to release.
    let held = lock::acquire(&request, on_lost)?;
    if let Err(e) = supervise::catch_signals(events.clone()) {
        held.release();
        return Err(Fail::other(format!("cannot catch signals: {e}")));
    }
    // A signal or a loss between the acquisition and now: the command is not started.
    while let Ok(event) = received.try_recv() {
        match event {
            Event::Signal(signal) => {
                held.release();
                return Ok(128 + signal);
            }
            Event::Lost(why) => {
                return Err(Fail {
                    code: EXIT_LOST,
                    message: format!(
                        "lock {:?} lost before the command started: {why}",
                        request.key
                    ),
                })
            }
            _ => {}
        }
    }

    let supervisor = match supervise::start(&command, &held.env(), grace, events) {
        Ok(supervisor) => supervisor,
        Err(e) => {
            held.release();
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(Fail {
                code,
                message: format!("could not start {:?}: {e}", command[0]),
            });
        }
    };
    let ended = supervisor.supervise(&received);
    let lost = held.is_lost();
    held.release();
    let ended = ended.map_err(|e| Fail::other(format!("supervising the command failed: {e}")))?;
    match ended.lost {
        Some(why) => Err(Fail {
            code: EXIT_LOST,
            message: format!(
                "lock {:?} lost while the command ran, command stopped: {why}",
                request.key
            ),
        }),
        None if lost => Err(Fail {
            code: EXIT_LOST,
            message: format!(
                "lock {:?} lost while the command ran (it ended with status {})",
                request.key, ended.code
            ),
        }),
        None => Ok(ended.code),
    }
}

/// The request, the grace period and the command; `None` after `--help`.
#[allow(clippy::type_complexity)]
fn parse(argv: Vec<OsString>) -> Result<Option<(Request, Duration, Vec<OsString>)>, Fail> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(argv);
    let mut nodes = None;
    let mut ttl = Duration::from_secs(30);
    let mut wait = Duration::from_secs(10);
    let mut grace = Duration::from_secs(10);
    let mut conflict_code = EXIT_NOT_ACQUIRED;
    let (mut read, mut write, mut fair, mut no_wait) = (false, false, false, false);
    let mut key = None;
    let mut permits = None;
    let mut command = Vec::new();
    let mut tls = args::TlsFiles::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long(name) if args::TlsFiles::takes(name) => {
                let name = name.to_owned();
                tls.set(&name, parser.value()?);
            }
            Long("nodes") => nodes = Some(args::text("--nodes", parser.value()?)?),
            Long("ttl") => ttl = args::duration("--ttl", parser.value()?)?,
            Short('w') | Long("wait") | Long("timeout") => {
                wait = args::seconds("--wait", parser.value()?)?
            }
            Short('n') | Long("nonblock") | Long("no-wait") => no_wait = true,
            Short('E') | Long("conflict-exit-code") => {
                let text = args::text("-E", parser.value()?)?;
                conflict_code = match text.parse::<u8>() {
                    Ok(code) => i32::from(code),
                    Err(_) => {
                        return Err(usage!("-E: {text:?} is not an exit status (0 to 255)").into())
                    }
                };
            }
            Long("grace") => grace = args::duration("--grace", parser.value()?)?,
            Long("read") => read = true,
            Long("write") => write = true,
            Long("fair") => fair = true,
            Long("permits") => {
                let text = args::text("--permits", parser.value()?)?;
                permits = Some(text.parse::<u32>().map_err(|_| {
                    usage!("--permits: {text:?} is not a number of permits (1 or more)")
                })?);
            }
            Short('h') | Long("help") => {
                return crate::print_text(&HELP.replace("{TLS}", args::TLS_HELP)).map(|_| None)
            }
            Value(value) if key.is_none() => key = Some(args::text("KEY", value)?),
            Value(program) => {
                command.push(program);
                command.extend(parser.raw_args()?);
                break;
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let key = key.ok_or_else(|| usage!("no KEY given"))?;
    tls.check()?;
    if command.is_empty() {
        return Err(usage!("no command given after KEY").into());
    }
    if read && write {
        return Err(usage!("give --read or --write, not both").into());
    }
    if permits.is_some() && (read || write) {
        return Err(
            usage!("--permits takes a semaphore's permit: not with --read or --write").into(),
        );
    }
    let kind = match (read, write, permits) {
        (_, _, Some(k)) => Kind::Permit(k),
        (true, _, _) => Kind::Read,
        (_, true, _) => Kind::Write,
        _ => Kind::Mutex,
    };
    let request = Request {
        nodes: args::nodes(nodes)?,
        key,
        kind,
        ttl,
        wait: if no_wait { Duration::ZERO } else { wait },
        fair,
        conflict_code,
        tls,
    };
    Ok(Some((request, grace, command)))
}
