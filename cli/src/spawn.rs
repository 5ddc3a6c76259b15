//! Starting the command: the one place in this package with `unsafe` code, a `pre_exec` hook
//! that puts the command in the state `run` promises.
//!
//! Between `fork` and `exec` the child:
//! - takes the terminal, when `run` hands it over (see [`Setup::terminal`]);
//! - resets every signal to its default disposition and empties its signal mask, whatever
//!   `run` inherited (a `run` started with `&` by a non-interactive shell has INT and QUIT
//!   ignored, and an ignored signal stays ignored across `exec`). The few signals the C
//!   library keeps for itself (32 and 33 with glibc) cannot be changed, and no program can
//!   use them;
//! - on Linux, asks for SIGKILL when `run` dies (`PR_SET_PDEATHSIG`), then checks that `run`
//!   is still its parent, in case it died before the request was made.
//!
//! Its own process group (`setpgid(0, 0)`) comes from `Command::process_group`, which the
//! standard library applies before this hook runs.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

/// How the command starts.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// A terminal whose foreground process group is `run`'s: the command's process group
    /// becomes the foreground one instead, so that the command can read the terminal and gets
    /// its signals (Ctrl-C, Ctrl-Z) as it would without `run`.
    pub terminal: Option<RawFd>,
}

/// The highest signal number reset: Linux's `SIGRTMAX`; lower on other systems, where the
/// numbers past theirs are refused harmlessly.
const LAST_SIGNAL: libc::c_int = 64;

/// Starts `command` in a process group of its own (its PID is the group's ID), set up as the
/// module docs say.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends: call this from the
/// main thread, which lives as long as `run`.
#[allow(unsafe_code)]
pub fn spawn(command: &mut Command, setup: Setup) -> io::Result<Child> {
    command.process_group(0);
    let parent = std::process::id() as libc::pid_t;
    let terminal = setup.terminal;
    let hook = move || -> io::Result<()> {
        // SAFETY: this runs in the child between fork and exec, where only async-signal-safe
        // functions may be called: every call below is a plain system call (tcsetpgrp,
        // getpid, signal, sigemptyset, sigprocmask, prctl, getppid) on values owned by this
        // closure, nothing allocates, and `set` is a local sigset_t that sigemptyset
        // initialises before use.
        unsafe {
            if let Some(fd) = terminal {
                // From a background group, tcsetpgrp would stop us with SIGTTOU unless it is
                // ignored; the loop below restores its default. A failure leaves the command
                // in the background: it then behaves as any background job.
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(fd, libc::getpid());
            }
            for signal in 1..=LAST_SIGNAL {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    // Numbers the system does not have, or reserves, fail harmlessly.
                    libc::signal(signal, libc::SIG_DFL);
                }
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // `run` died between fork and prctl: nobody would kill us later.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            #[cfg(not(target_os = "linux"))]
            let _ = parent;
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe calls (see inside it).
    unsafe {
        command.pre_exec(hook);
    }
    command.spawn()
}
