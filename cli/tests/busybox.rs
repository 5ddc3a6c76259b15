//! `redlock-mux run` as a process supervisor, on a system whose only tools are BusyBox's: the
//! command and `run` itself see a PATH of BusyBox applets and nothing else (no GNU `env`, no
//! bash), as on Alpine or the project's aarch64-musl target.
//!
//! Each test starts a `run` whose command is a BusyBox shell with a child in the foreground
//! and one in the background (`sh -c 'sleep & sleep'`), so that stopping the command means
//! stopping its process group, not one process. Then SIGTERM, SIGINT, a lost lock (the key
//! deleted on every node) or SIGKILL hits `run`, and the test checks that the command and its
//! children are gone, that a second `run` on the same key (started while the first one held the
//! lock, or after it ended) did not start its command while any of them was alive, and what
//! every node holds for the key afterwards (printed; run with `--nocapture` to see it).

mod support;

use std::fs;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use support::*;

/// How long a test waits for anything that should take a moment.
const PATIENCE: Duration = Duration::from_secs(10);

/// A first `run` holding `key` while its command (a BusyBox shell and two `sleep`s) runs.
struct Scenario {
    /// First, so that it drops first: the processes go before the servers.
    reaper: Reaper,
    cluster: RedisCluster,
    key: &'static str,
    log: PathBuf,
    /// The command's processes, one PID a line, for the second run's check.
    pids: PathBuf,
    first: Child,
    /// The shell and its two children.
    command: Vec<u32>,
}

impl Scenario {
    /// Starts the first `run ARGS KEY -- sh -c SCRIPT` under BusyBox and waits until it holds
    /// the lock and its command has both children.
    fn start(key: &'static str, args: &[&str]) -> Scenario {
        let cluster = RedisCluster::start(3).expect("start redis-server");
        let log = temp_file(&format!("{key}.log"));
        let pids = temp_file(&format!("{key}.pids"));
        let shell_pid = temp_file(&format!("{key}.sh"));
        // The shell logs a SIGTERM it gets (it runs its trap once its foreground child ended).
        let script = format!(
            "trap 'echo got-TERM >> {log}; exit 143' TERM; echo $$ > {sh}; \
             sleep 37 & echo started >> {log}; sleep 41; echo finished >> {log}",
            log = log.display(),
            sh = shell_pid.display()
        );
        let mut reaper = Reaper::default();
        let mut run_args = vec!["run"];
        run_args.extend_from_slice(args);
        run_args.extend_from_slice(&[key, "--", "sh", "-c", &script]);
        let first = under_busybox(&cluster, &run_args)
            .spawn()
            .expect("spawn run");
        reaper.watch(first.id(), BIN);
        wait_for_holder_of(&cluster, key);
        assert!(
            within(PATIENCE, || fs::read_to_string(&log)
                .is_ok_and(|l| l.contains("started"))),
            "the command did not start"
        );
        let sh: u32 = fs::read_to_string(&shell_pid)
            .expect("shell pid")
            .trim()
            .parse()
            .expect("shell pid");
        let _ = fs::remove_file(&shell_pid);
        reaper.watch(sh, "sleep 41");
        let mut command = vec![sh];
        assert!(
            within(PATIENCE, || children_of(sh).len() == 2),
            "the command's shell does not have its two children"
        );
        for child in children_of(sh) {
            reaper.watch(child, "sleep");
            command.push(child);
        }
        let list: String = command.iter().map(|p| format!("{p}\n")).collect();
        fs::write(&pids, list).expect("write pids");
        Scenario {
            reaper,
            cluster,
            key,
            log,
            pids,
            first,
            command,
        }
    }

    /// A second `run` on the same key (waiting up to 20 s): its command notes every process
    /// of the first command still alive when it starts, as `overlap PID`, then `second`.
    fn second_run(&mut self) -> Child {
        let check = format!(
            "for p in $(cat {pids}); do \
               if [ -e /proc/$p ] && ! grep -q '^State:.*[ZX]' /proc/$p/status 2>/dev/null; then \
                 echo overlap $p >> {log}; fi; done; echo second >> {log}",
            pids = self.pids.display(),
            log = self.log.display()
        );
        let child = under_busybox(
            &self.cluster,
            &["run", "--wait", "20s", self.key, "--", "sh", "-c", &check],
        )
        .spawn()
        .expect("spawn second run");
        self.reaper.watch(child.id(), BIN);
        child
    }

    /// Waits for the first run to end.
    fn first_exits(&mut self) -> ExitStatus {
        wait_at_most(&mut self.first, PATIENCE)
    }

    /// Fails unless every process of the first command is gone within `limit`.
    fn command_gone_within(&self, limit: Duration) {
        let alive = || {
            self.command
                .iter()
                .copied()
                .filter(|&p| alive(p))
                .collect::<Vec<_>>()
        };
        assert!(
            within(limit, || alive().is_empty()),
            "still alive: {:?}\nlog:\n{}",
            alive()
                .into_iter()
                .map(|p| format!("{p} {}", cmdline(p)))
                .collect::<Vec<_>>(),
            self.log_text()
        );
    }

    /// The second run succeeded, and no process of the first command was alive when its
    /// command started.
    fn second_did_not_overlap(&self, mut second: Child) {
        let status = wait_at_most(&mut second, Duration::from_secs(30));
        let log = self.log_text();
        assert!(status.success(), "second run: {status:?}\n{log}");
        assert!(log.contains("second"), "{log}");
        assert!(
            !log.contains("overlap"),
            "the second holder ran while the first command was alive:\n{log}"
        );
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Prints the key on every node (for the record) and checks that no node holds it.
    fn key_is_free_everywhere(&self, what: &str) {
        let state = key_state(&self.cluster, self.key);
        println!("{what}: the key on every node afterwards:\n{state}");
        for server in &self.cluster.servers {
            assert_eq!(
                get(server.addr(), self.key.as_bytes()),
                None,
                "{what}: a node still holds the key:\n{state}"
            );
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.log);
        let _ = fs::remove_file(&self.pids);
    }
}

/// SIGTERM to `run` reaches the command's process group; the lock is released once the
/// command is gone, and `run` exits as the command did (128 + 15).
#[test]
fn sigterm_reaches_the_command_under_busybox() {
    let mut s = Scenario::start("bb:term", &["--ttl", "2s", "--grace", "3s"]);
    let second = s.second_run();
    println!(
        "SIGTERM: run {} holds bb:term; command {:?}",
        s.first.id(),
        s.command
    );
    send("TERM", s.first.id());
    let status = s.first_exits();
    println!("SIGTERM: run {}", describe(status));
    assert_eq!(status.code(), Some(143), "{}", s.log_text());
    assert!(s.log_text().contains("got-TERM"), "{}", s.log_text());
    s.command_gone_within(Duration::from_secs(2));
    s.second_did_not_overlap(second);
    println!("SIGTERM: command gone; the second run waited for it");
    s.key_is_free_everywhere("SIGTERM");
}

/// SIGINT to `run` reaches the command's process group. The background `sleep` of the
/// command's shell ignores SIGINT (as POSIX shells start asynchronous commands); it is left in
/// the group when the shell ends, so `run` stops it (SIGTERM) before releasing the lock.
#[test]
fn sigint_reaches_the_command_under_busybox() {
    let mut s = Scenario::start("bb:int", &["--ttl", "2s", "--grace", "3s"]);
    let second = s.second_run();
    println!(
        "SIGINT: run {} holds bb:int; command {:?}",
        s.first.id(),
        s.command
    );
    send("INT", s.first.id());
    let status = s.first_exits();
    println!("SIGINT: run {}", describe(status));
    assert_eq!(status.code(), Some(130), "{}", s.log_text());
    assert!(!s.log_text().contains("finished"), "{}", s.log_text());
    s.command_gone_within(Duration::from_secs(2));
    s.second_did_not_overlap(second);
    println!("SIGINT: command gone; the second run waited for it");
    s.key_is_free_everywhere("SIGINT");
}

/// A lost lock (the key deleted on every node) stops the command with SIGTERM, which it
/// sees, well before the grace period ends; `run` exits 76 once the whole group is gone.
#[test]
fn a_lost_lock_stops_the_command_with_sigterm_under_busybox() {
    let grace = Duration::from_secs(5);
    let mut s = Scenario::start("bb:lost", &["--ttl", "2s", "--grace", "5s"]);
    println!(
        "lost lock: run {} holds bb:lost; command {:?}",
        s.first.id(),
        s.command
    );
    for server in &s.cluster.servers {
        cmd(server.addr(), &[b"DEL", s.key.as_bytes()]);
    }
    let deleted = Instant::now();
    println!("lost lock: the key deleted on every node");
    let status = s.first_exits();
    let took = deleted.elapsed();
    println!(
        "lost lock: run {} {took:?} after the deletion",
        describe(status)
    );
    assert_eq!(status.code(), Some(76), "{}", s.log_text());
    assert!(
        s.log_text().contains("got-TERM"),
        "the command never saw SIGTERM:\n{}",
        s.log_text()
    );
    assert!(
        took < grace,
        "took {took:?}: stopped by SIGKILL after the grace period?"
    );
    // Gone when `run` exits: a run started now must find none of them.
    let second = s.second_run();
    s.command_gone_within(Duration::from_secs(1));
    s.second_did_not_overlap(second);
    println!("lost lock: command gone; a second run found none of it");
    s.key_is_free_everywhere("lost lock");
}

/// SIGKILL to `run` (the PID its caller started) takes the command's whole process group with
/// it at once, so a second `run`, which gets the lock when its TTL runs out, never runs next
/// to it.
#[test]
fn sigkill_of_run_takes_the_command_with_it_under_busybox() {
    // A TTL that a loaded machine's keep-alive still meets: a lock lost to a late extension
    // before the SIGKILL would let the second run in next to the command, which is the
    // lost-lock case (`a_lost_lock_stops_the_command_with_sigterm_under_busybox`), not this one.
    let mut s = Scenario::start("bb:kill", &["--ttl", "6s"]);
    let second = s.second_run();
    println!(
        "SIGKILL: run {} holds bb:kill; command {:?}",
        s.first.id(),
        s.command
    );
    send("KILL", s.first.id());
    let status = s.first_exits();
    println!("SIGKILL: run {}", describe(status));
    s.command_gone_within(Duration::from_secs(2));
    println!("SIGKILL: command gone");
    s.second_did_not_overlap(second);
    println!("SIGKILL: the second run got the lock after its TTL, alone");
    s.key_is_free_everywhere("SIGKILL");
}

/// The PID the caller started is the supervisor itself (it runs the `redlock-mux` binary, so
/// `pidof redlock-mux` names it), and no other process running the binary sits between it and
/// the command.
#[test]
fn the_callers_pid_is_the_supervisor() {
    let s = Scenario::start("bb:pid", &["--ttl", "2s"]);
    let run = s.first.id();
    let bin = fs::canonicalize(BIN).expect("binary path");
    let exe = |pid: u32| fs::read_link(format!("/proc/{pid}/exe")).ok();
    assert_eq!(
        exe(run).as_deref(),
        Some(bin.as_path()),
        "the caller's PID runs {:?}",
        cmdline(run)
    );
    assert_eq!(
        parent_of(s.command[0]),
        Some(run),
        "the command is not run's child"
    );
    let others: Vec<String> = children_of(run)
        .into_iter()
        .filter(|&p| exe(p).as_deref() == Some(bin.as_path()))
        .map(|p| format!("{p} {}", cmdline(p)))
        .collect();
    assert!(others.is_empty(), "other copies of the binary: {others:?}");
    drop(s);
}

/// How a process ended, in words.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended: {status:?}"),
    }
}
