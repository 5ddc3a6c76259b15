//! `run`'s supervision of the command: signals passed on, the command stopped when the lock is
//! lost, its process group cleared before the lock is released, and a guardian that kills the
//! group if `run` itself is killed.
//!
//! Everything that happens arrives as an [`Event`] on one channel, from three sources: a
//! thread that receives the signals sent to `run` (signal-hook's self-pipe), a thread blocked
//! in `waitpid` on the command, and the library's keeper, which reports a lost lock. The main
//! thread acts on them in order, with no polling except while a process group empties.
//!
//! When `run` dies by SIGKILL it can do nothing, so two things act for it:
//! - on Linux the kernel sends SIGKILL to the command itself (`PR_SET_PDEATHSIG`, see
//!   [`spawn`](crate::spawn));
//! - a guardian, a tiny `sh` in a process group of its own, reads a pipe whose write end only
//!   `run` holds: when `run` dies the kernel closes it, the guardian reads end-of-file and
//!   sends SIGKILL to the command's whole process group, so that the command's children do
//!   not outlive the lock either. It runs `sh`, not this binary, so `pidof redlock-mux` names
//!   `run` alone. When `run` ends normally it writes a line first, and the guardian exits
//!   without a signal.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{self, Pid, Signal, WaitOptions, WaitStatus};
use rustix::termios;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};

use crate::spawn::{self, Setup};

/// The signals `run` passes on to the command's process group.
pub const FORWARDED: [i32; 6] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// How often a process group is checked while it empties.
const POLL: Duration = Duration::from_millis(10);
/// How long processes are given to die after SIGKILL (they may be stopped, or in the kernel).
const AFTER_KILL: Duration = Duration::from_secs(2);

/// What the supervisor reacts to.
#[derive(Debug)]
pub enum Event {
    /// A signal sent to `run`.
    Signal(i32),
    /// The lock was lost, for this reason.
    Lost(String),
    /// The command was stopped (Ctrl-Z at a terminal it holds).
    Stopped,
    /// The command ended.
    Exited(WaitStatus),
    /// Waiting for the command failed.
    WaitFailed(io::Error),
}

/// The channel every event source sends on.
pub fn channel() -> (Sender<Event>, Receiver<Event>) {
    mpsc::channel()
}

/// Catches [`FORWARDED`] signals from now on, sending each as an [`Event::Signal`].
pub fn catch_signals(events: Sender<Event>) -> io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new(FORWARDED)?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if events.send(Event::Signal(signal)).is_err() {
                    break;
                }
            }
        })?;
    Ok(())
}

/// How the command ended.
#[derive(Debug)]
pub struct Ended {
    /// The shell's convention: its exit status, or 128 + the signal that killed it.
    pub code: i32,
    /// Why the lock was lost, if it was while the command ran.
    pub lost: Option<String>,
}

/// A started command under supervision.
pub struct Supervisor {
    /// The command's PID, which is also its process group's ID.
    pid: Pid,
    guardian: Option<Guardian>,
    terminal: Option<Terminal>,
    grace: Duration,
}

/// Starts `command` (program and arguments) with `env` added to `run`'s environment, and the
/// guardian. Call it from the main thread (see [`spawn::spawn`]).
pub fn start(
    command: &[OsString],
    env: &[(&'static str, OsString)],
    grace: Duration,
    events: Sender<Event>,
) -> io::Result<Supervisor> {
    #[cfg(target_os = "linux")]
    {
        // Orphaned descendants of the command come to us, so that the ones left in its
        // process group can be waited for and reaped (see `clear_group`).
        let _ = process::set_child_subreaper(Some(process::getpid()));
    }
    let terminal = Terminal::find();
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    for (name, value) in env {
        cmd.env(name, value);
    }
    let child = spawn::spawn(
        &mut cmd,
        Setup {
            terminal: terminal.map(Terminal::fd),
        },
    )?;
    let raw = child.id() as i32;
    let pid = Pid::from_raw(raw).ok_or_else(|| io::Error::other("the command has no PID"))?;
    drop(child); // waited for by the waiter thread, by PID
    let guardian = Guardian::start(pid);
    thread::Builder::new()
        .name("waiter".into())
        .spawn(move || wait_for(pid, events))?;
    Ok(Supervisor {
        pid,
        guardian,
        terminal,
        grace,
    })
}

/// One of the standard streams, when it is a terminal whose foreground process group was
/// `run`'s at the start: the command gets that terminal.
#[derive(Debug, Clone, Copy)]
enum Terminal {
    Stdin,
    Stdout,
    Stderr,
}

impl Terminal {
    /// The first of stdin, stdout and stderr that is a terminal with `run`'s process group in
    /// the foreground.
    fn find() -> Option<Terminal> {
        [Terminal::Stdin, Terminal::Stdout, Terminal::Stderr]
            .into_iter()
            .find(|t| t.is_tty() && t.in_foreground())
    }

    fn fd(self) -> RawFd {
        match self {
            Terminal::Stdin => 0,
            Terminal::Stdout => 1,
            Terminal::Stderr => 2,
        }
    }

    fn is_tty(self) -> bool {
        match self {
            Terminal::Stdin => termios::isatty(io::stdin()),
            Terminal::Stdout => termios::isatty(io::stdout()),
            Terminal::Stderr => termios::isatty(io::stderr()),
        }
    }

    /// Whether `run`'s process group is the terminal's foreground one.
    fn in_foreground(self) -> bool {
        let foreground = match self {
            Terminal::Stdin => termios::tcgetpgrp(io::stdin()),
            Terminal::Stdout => termios::tcgetpgrp(io::stdout()),
            Terminal::Stderr => termios::tcgetpgrp(io::stderr()),
        };
        foreground.is_ok_and(|p| p == process::getpgrp())
    }

    /// Makes `group` the terminal's foreground process group.
    fn hand_to(self, group: Pid) {
        let _ = match self {
            Terminal::Stdin => termios::tcsetpgrp(io::stdin(), group),
            Terminal::Stdout => termios::tcsetpgrp(io::stdout(), group),
            Terminal::Stderr => termios::tcsetpgrp(io::stderr(), group),
        };
    }
}

/// The waiter thread: reports stops and the end of the command.
fn wait_for(pid: Pid, events: Sender<Event>) {
    loop {
        let event = match process::waitpid(Some(pid), WaitOptions::UNTRACED) {
            Ok(Some((_, status))) if status.stopped() => Event::Stopped,
            Ok(Some((_, status))) => Event::Exited(status),
            Ok(None) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => Event::WaitFailed(e.into()),
        };
        let last = !matches!(event, Event::Stopped);
        if events.send(event).is_err() || last {
            return;
        }
    }
}

impl Supervisor {
    /// Acts on events until the command has ended and no process is left in its process
    /// group. The lock is still held when this returns; releasing it is the caller's.
    pub fn supervise(mut self, events: &Receiver<Event>) -> io::Result<Ended> {
        let mut lost: Option<String> = None;
        // When a SIGKILL is due, after a SIGTERM for a lost lock.
        let mut kill_at: Option<Instant> = None;
        let status = loop {
            let event = match kill_at {
                Some(at) => match events.recv_timeout(at.saturating_duration_since(Instant::now()))
                {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => {
                        eprintln!(
                            "redlock-mux: the command outlived the grace period; sending SIGKILL to its process group"
                        );
                        self.signal_group(Signal::KILL);
                        kill_at = None;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break None,
                },
                None => match events.recv() {
                    Ok(event) => event,
                    Err(_) => break None,
                },
            };
            match event {
                Event::Signal(number) => {
                    if let Some(signal) = Signal::from_named_raw(number) {
                        self.signal_group(signal);
                    }
                }
                Event::Lost(why) => {
                    if lost.is_none() {
                        eprintln!(
                            "redlock-mux: lock lost ({why}); sending SIGTERM to the command's process group"
                        );
                        self.stop_group();
                        kill_at = Some(Instant::now() + self.grace);
                        lost = Some(why);
                    }
                }
                Event::Stopped => self.stopped(),
                Event::Exited(status) => break Some(status),
                Event::WaitFailed(e) => return Err(e),
            }
        };
        let status = status.ok_or_else(|| io::Error::other("lost track of the command"))?;
        let deadline = kill_at.unwrap_or_else(|| Instant::now() + self.grace);
        self.clear_group(deadline);
        if let Some(guardian) = self.guardian.take() {
            guardian.disarm();
        }
        let code = match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        };
        Ok(Ended { code, lost })
    }

    /// Sends `signal` to the command's process group.
    fn signal_group(&self, signal: Signal) {
        let _ = process::kill_process_group(self.pid, signal);
    }

    /// SIGTERM to the group, and SIGCONT so that stopped members can act on it.
    fn stop_group(&self) {
        self.signal_group(Signal::TERM);
        self.signal_group(Signal::CONT);
    }

    /// The command stopped at its terminal (Ctrl-Z): `run` stops too, with the rest of its
    /// own process group, so that the shell that started it sees the job stopped and takes the
    /// terminal back. When continued, `run` gives the terminal back to the command if `run`
    /// is in the foreground, and continues the command.
    ///
    /// While `run` is stopped, so is the keeper: a lock whose TTL runs out meanwhile is lost
    /// when `run` continues, and the command is stopped as for any lost lock.
    fn stopped(&self) {
        let Some(terminal) = self.terminal else {
            // Stopped by someone else's signal: not ours to act on.
            return;
        };
        let _ = process::kill_current_process_group(Signal::STOP);
        // Continued: in the foreground (`fg`) or not (`bg`).
        if terminal.in_foreground() {
            terminal.hand_to(self.pid);
        }
        self.signal_group(Signal::CONT);
    }

    /// Waits until no process is left in the command's process group. Those still there
    /// (children the command left behind, or that ignored SIGTERM) ran under the lock and must
    /// not outlive it: they get SIGTERM, and SIGKILL at `deadline`.
    fn clear_group(&self, deadline: Instant) {
        if !self.group_alive() {
            return;
        }
        eprintln!(
            "redlock-mux: processes the command started are still in its process group; \
             sending them SIGTERM before releasing the lock"
        );
        self.stop_group();
        while self.group_alive() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        if !self.group_alive() {
            return;
        }
        eprintln!("redlock-mux: sending SIGKILL to what is left of the command's process group");
        self.signal_group(Signal::KILL);
        let until = Instant::now() + AFTER_KILL;
        while self.group_alive() && Instant::now() < until {
            thread::sleep(POLL);
        }
    }

    /// Whether any process is left in the command's process group, after reaping those of
    /// them that are our children (orphans come to us on Linux).
    fn group_alive(&self) -> bool {
        while let Ok(Some(_)) = process::waitpgid(self.pid, WaitOptions::NOHANG) {}
        process::test_kill_process_group(self.pid).is_ok()
    }
}

/// The `sh` that kills the command's process group when `run` dies (see the module docs).
struct Guardian {
    child: std::process::Child,
    pipe: ChildStdin,
}

/// `$1` is the process group. `read` fails at end of file, which only `run`'s death brings
/// without a line first.
const GUARDIAN: &str = "read _ || kill -KILL -\"$1\"";

impl Guardian {
    /// Starts the guardian of process group `pgid`; warns and returns `None` without `sh`.
    fn start(pgid: Pid) -> Option<Guardian> {
        let started = Command::new("sh")
            .args(["-c", GUARDIAN, "redlock-mux-guardian"])
            .arg(pgid.as_raw_nonzero().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of `run`'s process group: signals for that group are not its business.
            .process_group(0)
            .spawn();
        match started {
            Ok(mut child) => {
                let pipe = child.stdin.take()?;
                Some(Guardian { child, pipe })
            }
            Err(e) => {
                eprintln!(
                    "redlock-mux: cannot start sh to guard the command ({e}); if redlock-mux is \
                     killed, processes the command started may outlive the lock"
                );
                None
            }
        }
    }

    /// Tells the guardian to exit without a signal, and reaps it.
    fn disarm(mut self) {
        let _ = self.pipe.write_all(b"\n");
        drop(self.pipe);
        let deadline = Instant::now() + AFTER_KILL;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            thread::sleep(POLL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
