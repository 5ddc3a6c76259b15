//! The `redlock-mux` binary against real redis-server processes: `run` excludes, times out,
//! stops its command when the lock is lost, keeps short locks alive, passes signals on and
//! survives a killed holder; `--read` runs share, `--write` runs exclude them, `--permits K`
//! runs hold at most K at once, `--fair` runs queue in arrival order; `inspect` shows the holder, readers and queue; every command has
//! `--help`.

mod support;

use std::fs;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const KEY: &str = "cli:job";

/// The token on a quorum of the nodes, if one token is on a quorum.
fn holder(cluster: &RedisCluster) -> Option<Vec<u8>> {
    holder_of(cluster, KEY)
}

/// Waits up to 10 s for someone to hold the lock; returns the token.
fn wait_for_holder(cluster: &RedisCluster) -> Vec<u8> {
    wait_for_holder_of(cluster, KEY)
}

#[test]
fn concurrent_runs_on_one_key_never_overlap() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let log = temp_file("overlap.log");
    let script = format!(
        "echo start $1 >> '{0}'; sleep 0.05; echo end $1 >> '{0}'",
        log.display()
    );
    let mut children: Vec<Child> = (0..8)
        .map(|i| {
            redlock_mux(
                &cluster,
                &["run", "--ttl", "5s", "--wait", "30s", KEY, "--"],
            )
            .args(["sh", "-c", &script, "sh", &i.to_string()])
            .spawn()
            .expect("spawn")
        })
        .collect();
    for child in &mut children {
        assert!(wait_at_most(child, Duration::from_secs(40)).success());
    }
    let text = fs::read_to_string(&log).expect("log");
    let _ = fs::remove_file(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 16, "{text}");
    // Appends land in time order: each start must be followed by its own end.
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start ").expect(&text);
        let end = pair[1].strip_prefix("end ").expect(&text);
        assert_eq!(start, end, "two commands overlapped:\n{text}");
    }
}

#[test]
fn a_held_lock_makes_run_exit_75_after_the_wait() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let client = client(&cluster);
    let lock = client.lock(KEY, Duration::from_secs(10)).expect("lock");
    let out = output(&cluster, &["run", "--wait", "300ms", KEY, "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not acquired"), "{stderr}");
    lock.release().expect("release");
}

#[test]
fn a_misconfigured_node_makes_run_exit_78_at_once_and_writes_nothing() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    let addr = cluster.addrs()[0];
    let marker = temp_file("misconfigured.ran");
    let start = Instant::now();
    // A password for a server that has none: its AUTH is refused.
    let mut child = Command::new(BIN)
        .args(["run", "--nodes", &format!("redis://:secret@{addr}")])
        .args(["--wait", "20s", KEY, "--", "touch"])
        .arg(&marker)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    let elapsed = start.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(dbsize(addr), 0, "a key was written: {stderr}");
    assert!(!marker.exists(), "the command ran without the lock");
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("AUTH"), "{stderr}");
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?}: a config error must not wait out --wait"
    );
}

#[test]
fn a_lost_lock_stops_the_command_and_exits_76() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let mut child = redlock_mux(
        &cluster,
        &[
            "run", "--ttl", "1s", "--grace", "1s", KEY, "--", "sleep", "30",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    wait_for_holder(&cluster);
    for server in &cluster.servers {
        set(server.addr(), KEY.as_bytes(), b"someone-else");
    }
    let status = wait_at_most(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(76));
    // The other holder's key is left alone.
    assert_eq!(holder(&cluster).as_deref(), Some(&b"someone-else"[..]));
}

#[test]
fn auto_extension_keeps_a_1s_lock_through_a_5s_command() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let mut child = redlock_mux(&cluster, &["run", "--ttl", "1s", KEY, "--", "sleep", "5"])
        .spawn()
        .expect("spawn");
    let token = wait_for_holder(&cluster);
    for _ in 0..4 {
        thread::sleep(Duration::from_secs(1));
        assert_eq!(holder(&cluster), Some(token.clone()), "the lock lapsed");
    }
    assert!(wait_at_most(&mut child, Duration::from_secs(10)).success());
    assert_eq!(holder(&cluster), None, "not released");
}

#[test]
fn a_killed_holder_lets_another_run_in_after_the_ttl() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let mut holder_run = redlock_mux(&cluster, &["run", "--ttl", "1s", KEY, "--", "sleep", "30"])
        .spawn()
        .expect("spawn");
    wait_for_holder(&cluster);
    let killed = Command::new("kill")
        .args(["-KILL", &holder_run.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let _ = holder_run.wait();
    let out = output(
        &cluster,
        &["run", "--wait", "5s", KEY, "--", "echo", "second"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "second\n");
}

#[test]
fn term_is_passed_to_the_command_and_the_lock_released() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let mut child = redlock_mux(&cluster, &["run", KEY, "--", "sleep", "30"])
        .spawn()
        .expect("spawn");
    wait_for_holder(&cluster);
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = wait_at_most(&mut child, Duration::from_secs(10));
    // The shell's convention for a command ended by SIGTERM.
    assert_eq!(status.code(), Some(128 + 15));
    assert_eq!(holder(&cluster), None, "not released");
}

#[test]
fn run_exits_with_the_command_status() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let out = output(&cluster, &["run", KEY, "--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(holder(&cluster), None);
}

#[test]
fn inspect_shows_the_holder() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let client = client(&cluster);
    let lock = client.lock(KEY, Duration::from_secs(30)).expect("lock");
    let out = output(&cluster, &["inspect", KEY]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = String::from_utf8_lossy(&lock.token()[..12]).into_owned();
    assert_eq!(text.matches(&prefix).count(), 4, "{text}");
    assert!(text.contains("HELD"), "{text}");
    lock.release().expect("release");
    let text = String::from_utf8_lossy(&output(&cluster, &["inspect", KEY]).stdout).into_owned();
    assert!(text.contains("FREE"), "{text}");
}

#[test]
fn every_command_has_help_and_bad_usage_exits_64() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    for command in ["run", "bench", "inspect"] {
        let out = output(&cluster, &[command, "--help"]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("Usage: redlock-mux"));
    }
    assert!(output(&cluster, &["--help"]).status.success());
    for bad in [
        &["run", "--ttl", "10", KEY, "--", "true"][..],
        &["run", "--read", "--write", KEY, "--", "true"],
        &["run", KEY],
        &["run", "-E", "256", KEY, "--", "true"],
        &["run", "-w", "soon", KEY, "--", "true"],
        &["run", "--bogus", KEY, "--", "true"],
        &["inspect"],
        &["bench", "--mode", "fast"],
        &["frobnicate"],
    ] {
        assert_eq!(output(&cluster, bad).status.code(), Some(64), "{bad:?}");
    }
    for fair_rw in ["--read", "--write"] {
        let ok = output(&cluster, &["run", "--fair", fair_rw, KEY, "--", "true"]);
        assert!(ok.status.success(), "--fair {fair_rw}: {ok:?}");
    }
    // The exit statuses are documented where a user looks for them.
    let help = String::from_utf8_lossy(&output(&cluster, &["run", "--help"]).stdout).into_owned();
    let readme = include_str!("../../README.md");
    for status in ["75", "76", "78", "64"] {
        assert!(
            help.contains(&format!("  {status} ")),
            "{status} not in run --help"
        );
        assert!(readme.contains(status), "{status} not in the README");
    }
}

#[test]
fn flock_habits_wait_no_wait_and_conflict_status() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let client = client(&cluster);
    let lock = client.lock(KEY, Duration::from_secs(30)).expect("lock");
    // -n: one attempt, at once.
    let start = Instant::now();
    let out = output(&cluster, &["run", "-n", KEY, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", both(&out));
    assert!(start.elapsed() < Duration::from_secs(5));
    // -E: another status for a conflict; -w with a bare number of seconds.
    let start = Instant::now();
    let out = output(&cluster, &["run", "-E", "3", "-w", "0.3", KEY, "true"]);
    assert_eq!(out.status.code(), Some(3), "{}", both(&out));
    assert!(start.elapsed() >= Duration::from_millis(300));
    let out = output(
        &cluster,
        &["run", "--conflict-exit-code=9", "-nw", "5", KEY, "true"],
    );
    assert_eq!(out.status.code(), Some(9), "{}", both(&out));
    lock.release().expect("release");
    // As with flock(1), the command may follow the key without `--`; what follows is its own.
    let out = output(&cluster, &["run", "-w", "5", KEY, "echo", "-n", "--ttl"]);
    assert!(out.status.success(), "{}", both(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "--ttl");
}

#[test]
fn the_command_gets_the_key_and_the_token() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let seen = temp_file("env.seen");
    let script = format!(
        "echo \"$REDLOCK_MUX_KEY $REDLOCK_MUX_TOKEN ${{REDLOCK_MUX_FENCE-none}}\" > {}.tmp; \
         mv {0}.tmp {0}; sleep 1",
        seen.display()
    );
    let mut child = redlock_mux(&cluster, &["run", KEY, "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    let token = wait_for_holder(&cluster);
    assert!(within(Duration::from_secs(10), || seen.exists()));
    let text = fs::read_to_string(&seen).expect("seen");
    let _ = fs::remove_file(&seen);
    assert_eq!(
        text,
        format!("{KEY} {} none\n", String::from_utf8_lossy(&token)),
        "the command's environment"
    );
    assert!(wait_at_most(&mut child, Duration::from_secs(10)).success());
}

#[test]
fn hup_reaches_the_command() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let ready = temp_file("hup.ready");
    let script = format!(
        "trap 'exit 5' HUP; touch {}; sleep 30 & wait",
        ready.display()
    );
    let mut child = redlock_mux(&cluster, &["run", KEY, "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    assert!(within(Duration::from_secs(10), || ready.exists()));
    let _ = fs::remove_file(&ready);
    send("HUP", child.id());
    let status = wait_at_most(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(5));
    assert_eq!(holder(&cluster), None, "not released");
}

/// A `run` started in the background by a non-interactive shell inherits INT and QUIT
/// ignored; its command starts with every signal at its default and none blocked.
#[test]
fn the_command_starts_with_default_signal_handling() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    // BusyBox's sh starts `run` in the background, then waits for it.
    let out = Command::new(busybox_path().join("sh"))
        .args([
            "-c",
            "\"$0\" run sig:key cat /proc/self/status & wait $!",
            BIN,
        ])
        .env_clear()
        .env("PATH", busybox_path())
        .env("REDLOCK_NODES", nodes(&cluster))
        .output()
        .expect("sh");
    assert!(out.status.success(), "{}", both(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let mask = |name: &str| {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        u64::from_str_radix(line.trim(), 16).expect("hex mask")
    };
    // Signals 1 to 31. (Those the C library keeps for itself, 32 and 33 on glibc, are left as
    // they were: programs cannot use them, and glibc refuses to change them.)
    assert_eq!(mask("SigBlk:") & 0x7fff_ffff, 0, "{text}");
    assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0, "{text}");
}

/// Three [`spawn_run`]s with ids `PREFIX0` to `PREFIX2`.
fn spawn_runs(cluster: &RedisCluster, args: &[&str], script: &str, prefix: &str) -> Vec<Child> {
    (0..3)
        .map(|i| spawn_run(cluster, args, script, &format!("{prefix}{i}")))
        .collect()
}

/// Runs `redlock-mux run ARGS KEY -- sh -c SCRIPT sh ID`.
fn spawn_run(cluster: &RedisCluster, args: &[&str], script: &str, id: &str) -> Child {
    redlock_mux(cluster, &["run"])
        .args(args)
        .args([KEY, "--", "sh", "-c", script, "sh", id])
        .spawn()
        .expect("spawn")
}

#[test]
fn read_runs_overlap_and_write_runs_exclude_them() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let log = temp_file("rw.log");
    // Each reader waits (at most 5 s) until all three readers have started: they only get
    // past that together if they hold the read lock at the same time.
    let reader = format!(
        "echo start $1 >> '{0}'; i=0; \
         while [ $(grep -c '^start r' '{0}') -lt 3 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; \
         echo end $1 >> '{0}'",
        log.display()
    );
    let writer = format!(
        "echo start $1 >> '{0}'; sleep 0.1; echo end $1 >> '{0}'",
        log.display()
    );
    let args = ["--ttl", "2s", "--wait", "30s"];
    let mut readers = spawn_runs(&cluster, &[&args[..], &["--read"]].concat(), &reader, "r");
    for child in &mut readers {
        assert!(wait_at_most(child, Duration::from_secs(20)).success());
    }
    let text = fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(
        lines[..3].iter().all(|l| l.starts_with("start r")),
        "the readers did not hold the lock together:\n{text}"
    );

    // Writers and readers mixed: no line may come between a writer's start and its end.
    fs::remove_file(&log).expect("clear log");
    // Short readers: the same script as the writers, under the read lock.
    let mut children = spawn_runs(&cluster, &[&args[..], &["--write"]].concat(), &writer, "w");
    children.extend(spawn_runs(
        &cluster,
        &[&args[..], &["--read"]].concat(),
        &writer,
        "r",
    ));
    for child in &mut children {
        assert!(wait_at_most(child, Duration::from_secs(40)).success());
    }
    let text = fs::read_to_string(&log).expect("log");
    let _ = fs::remove_file(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{text}");
    for (i, line) in lines.iter().enumerate() {
        if let Some(w) = line.strip_prefix("start w") {
            assert_eq!(
                lines.get(i + 1).copied(),
                Some(format!("end w{w}").as_str()),
                "a writer overlapped another run:\n{text}"
            );
        }
    }
}

/// `--permits 2` runs: at most two commands at once, and two do run together; a run that
/// disagrees on the permits exits 78 at once, and `--permits 0` is a usage error.
#[test]
fn permit_runs_hold_at_most_k_at_once() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let log = temp_file("permits.log");
    let script = format!(
        "echo start $1 >> '{0}'; sleep 0.2; echo end $1 >> '{0}'",
        log.display()
    );
    let args = ["--ttl", "2s", "--wait", "30s", "--permits", "2"];
    let mut children: Vec<Child> = (0..6)
        .map(|i| spawn_run(&cluster, &args, &script, &format!("p{i}")))
        .collect();
    for child in &mut children {
        assert!(wait_at_most(child, Duration::from_secs(40)).success());
    }
    let text = fs::read_to_string(&log).expect("log");
    let _ = fs::remove_file(&log);
    assert_eq!(text.lines().count(), 12, "{text}");
    // Appends land in time order: count the commands running after each line.
    let (mut running, mut most) = (0i32, 0i32);
    for line in text.lines() {
        running += if line.starts_with("start ") { 1 } else { -1 };
        most = most.max(running);
    }
    assert_eq!(most, 2, "at most and at least two at once:\n{text}");

    let client = client(&cluster);
    let held = client
        .semaphore(KEY, 3)
        .and_then(|s| s.try_acquire(Duration::from_secs(10)))
        .expect("permit");
    let start = Instant::now();
    let out = output(
        &cluster,
        &["run", "--permits", "2", "--wait", "20s", KEY, "--", "true"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    // At N = 3, 3 permits take 2 slots per node (quorum 2), 2 permits 2 (quorum 3).
    assert!(
        stderr.contains("3 permits, 2 per node, not 2 permits"),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "waited out --wait"
    );
    // One permit is one key per node (one slot each), where the sorted set of 3 permits is.
    let out = output(
        &cluster,
        &["run", "--permits", "1", "--wait", "20s", KEY, "--", "true"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("more than 1 per node, not 1 permits, 1 per node"),
        "{stderr}"
    );
    held.release().expect("release");
    // `--permits 1` runs hold the key one at a time.
    let out = output(&cluster, &["run", "--permits", "1", KEY, "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in [
        &["--permits", "0"][..],
        &["--permits", "x"],
        &["--permits", "2", "--read"],
    ] {
        let out = output(
            &cluster,
            &[&["run"][..], bad, &[KEY, "--", "true"]].concat(),
        );
        assert_eq!(
            out.status.code(),
            Some(64),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The output of `redlock-mux inspect KEY`.
fn inspect(cluster: &RedisCluster) -> String {
    let out = output(cluster, &["inspect", KEY]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `inspect` until its output contains `needle`, for at most 10 s.
fn inspect_until(cluster: &RedisCluster, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = inspect(cluster);
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn fair_runs_queue_in_order_and_inspect_shows_readers_and_queue() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let client = client(&cluster);
    let reader = client
        .read_lock(KEY, Duration::from_secs(30))
        .expect("read lock");
    let holder = client.lock(KEY, Duration::from_secs(30)).expect("lock");
    let log = temp_file("fair.log");
    let script = format!("echo $1 >> '{}'", log.display());
    let fair = ["--fair", "--wait", "30s"];

    let mut first = spawn_run(&cluster, &fair, &script, "first");
    let text = inspect_until(&cluster, "queue:   1 waiting");
    assert!(text.contains("queue:   1 waiting on a quorum"), "{text}");
    let mut second = spawn_run(&cluster, &fair, &script, "second");
    let text = inspect_until(&cluster, "queue:   2 waiting");
    assert!(text.contains("queue:   2 waiting on a quorum"), "{text}");
    // Per node, on at least a quorum (an entry a slow waiter has not yet refreshed may lapse
    // on one node for a moment; it is back at the waiter's next retry).
    assert!(text.matches("queue    2 waiting").count() >= 2, "{text}");

    // The reader on each node, with its remaining ms, and on a quorum in the summary.
    let reader_prefix = String::from_utf8_lossy(&reader.token()[..12]).into_owned();
    let holder_prefix = String::from_utf8_lossy(&holder.token()[..12]).into_owned();
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("readers  1: ") && l.contains(&reader_prefix))
            .count(),
        3,
        "{text}"
    );
    for line in text.lines().filter(|l| l.contains("readers  1: ")) {
        let ms: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|w| w.strip_suffix("ms"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no remaining ms in {line:?}"));
        assert!(ms > 0 && ms <= 30_000, "{line}");
    }
    assert!(text.contains("readers: 1 on a quorum"), "{text}");
    assert!(
        text.contains(&format!("mutex:   HELD by {holder_prefix}")),
        "{text}"
    );
    assert!(text.contains("writer:  FREE on a quorum"), "{text}");

    holder.release().expect("release");
    assert!(wait_at_most(&mut first, Duration::from_secs(20)).success());
    assert!(wait_at_most(&mut second, Duration::from_secs(20)).success());
    let order = fs::read_to_string(&log).expect("log");
    let _ = fs::remove_file(&log);
    assert_eq!(order, "first\nsecond\n", "served out of arrival order");
    reader.release().expect("release reader");
    let text = inspect(&cluster);
    assert!(text.contains("readers: none on a quorum"), "{text}");
    assert!(text.contains("queue:   0 waiting"), "{text}");
}

#[test]
fn version_is_printed() {
    for flag in ["--version", "-V"] {
        let out = Command::new(BIN).arg(flag).output().expect("run");
        assert!(out.status.success(), "{flag}: {}", both(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("redlock-mux {}\n", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
}

#[test]
fn run_help_agrees_with_the_readme_on_fair_read_and_write() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    let help = String::from_utf8_lossy(&output(&cluster, &["run", "--help"]).stdout).into_owned();
    let readme = include_str!("../../README.md");
    // The README runs readers and writers with --fair...
    assert!(readme.contains("run --read  --fair"), "README changed");
    assert!(readme.contains("run --write --fair"), "README changed");
    // ... so the help must not say they do not go together.
    assert!(
        !help.contains("not with --read or --write"),
        "run --help contradicts the README:\n{help}"
    );
    assert!(help.contains("--fair"), "{help}");
}

#[test]
fn a_ttl_that_cannot_be_kept_alive_is_a_usage_error_before_locking() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let marker = temp_file("short-ttl.ran");
    let out = redlock_mux(&cluster, &["run", "--ttl", "5ms", KEY, "--", "touch"])
        .arg(&marker)
        .output()
        .expect("run");
    let ran = marker.exists();
    let _ = fs::remove_file(&marker);
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    assert!(!ran, "the command ran under a lock that could not be kept");
    for server in &cluster.servers {
        assert_eq!(dbsize(server.addr()), 0, "something was locked");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ttl"), "{stderr}");
}

/// The command's child hands its lock over: another client resumes it from
/// `REDLOCK_MUX_KEY` and `REDLOCK_MUX_TOKEN`, extends it and releases it.
#[test]
fn a_lock_taken_by_run_is_resumed_from_its_token() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let seen = temp_file("resume.seen");
    let script = format!(
        "echo \"$REDLOCK_MUX_KEY $REDLOCK_MUX_TOKEN\" > {}.tmp; mv {0}.tmp {0}; sleep 5",
        seen.display()
    );
    let mut child = redlock_mux(&cluster, &["run", KEY, "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    assert!(within(Duration::from_secs(10), || seen.exists()));
    let text = fs::read_to_string(&seen).expect("seen");
    let _ = fs::remove_file(&seen);
    let (key, token) = text.trim_end().split_once(' ').expect("key and token");
    let c = client(&cluster);
    let mut lock = c
        .resume_lock(key, token, Duration::from_secs(20))
        .expect("resume");
    lock.extend(Duration::from_secs(20)).expect("extend");
    assert_eq!(holder(&cluster).as_deref(), Some(token.as_bytes()));
    lock.release().expect("release");
    assert_eq!(holder(&cluster), None, "released on every node");
    // The command finds its lock gone; how it ends is its own business here.
    send("TERM", child.id());
    let _ = wait_at_most(&mut child, Duration::from_secs(10));
}
