//! Processes and their costs, for the tests that fork while the client is in use or measure
//! the CPU time the client spends: a child runs the test's own code, reports through its exit
//! code and `_exit`s; the parent waits for it with a deadline and kills it by PID if it hangs.

use std::panic::{self, AssertUnwindSafe};
use std::thread;
use std::time::{Duration, Instant};

// A test may call the C library directly; the library itself has no unsafe code here.
#[allow(unsafe_code)]
pub mod sys {
    extern "C" {
        fn fork() -> i32;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
        fn kill(pid: i32, signal: i32) -> i32;
        fn _exit(code: i32) -> !;
    }

    const WNOHANG: i32 = 1;
    const SIGKILL: i32 = 9;

    /// `fork()`: the child's PID in the parent, 0 in the child, negative on failure.
    pub fn fork_process() -> i32 {
        // SAFETY: the child only runs the test's own code and then `_exit`s.
        unsafe { fork() }
    }

    /// Waits for child `pid` to end: its raw wait status.
    pub fn wait(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer for the call.
        unsafe { waitpid(pid, &mut status, 0) };
        status
    }

    /// The child's exit code once it has ended, `None` while it runs (-1 if killed by a
    /// signal).
    pub fn try_wait(pid: i32) -> Option<i32> {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer for the call.
        let r = unsafe { waitpid(pid, &mut status, WNOHANG) };
        if r == 0 {
            return None;
        }
        Some(if status & 0x7f == 0 {
            (status >> 8) & 0xff
        } else {
            -1
        })
    }

    /// Kills child `pid` and reaps it.
    pub fn kill_and_reap(pid: i32) {
        // SAFETY: `pid` is a child of this process that was not reaped yet.
        unsafe {
            kill(pid, SIGKILL);
            waitpid(pid, std::ptr::null_mut(), 0);
        }
    }

    /// Ends the child without running the parent's exit handlers.
    pub fn exit(code: i32) -> ! {
        // SAFETY: `_exit` ends the process at once; nothing of the parent's runs twice.
        unsafe { _exit(code) }
    }
}

/// Forks; the child runs `child` (its result is its exit code, a panic is 99) and `_exit`s.
/// Returns the child's PID.
pub fn fork_child(child: impl FnOnce() -> i32) -> i32 {
    let pid = sys::fork_process();
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = panic::catch_unwind(AssertUnwindSafe(child)).unwrap_or(99);
        sys::exit(code);
    }
    // What the child was given stays the parent's as it was: nothing it holds is dropped here.
    std::mem::forget(child);
    pid
}

/// Waits for child `pid` at most `limit`: its exit code, or `None` if it had to be killed.
pub fn wait_child(pid: i32, limit: Duration) -> Option<i32> {
    let until = Instant::now() + limit;
    loop {
        if let Some(code) = sys::try_wait(pid) {
            return Some(code);
        }
        if Instant::now() >= until {
            sys::kill_and_reap(pid);
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The CPU time (user and system) this process has used so far, from `/proc/self/stat`.
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The command name may hold spaces: the fields counted are after its closing parenthesis.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel counts in USER_HZ, 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}

/// How many threads this process has now.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count()
}
