//! The fault suite: threads, and in one scenario several processes, contend for one lock on
//! three real `redis-server` processes while faults are injected:
//!
//! - on the servers: kill -9 and restart after longer than the TTL, kill -9 and immediate
//!   restart of a server that persists every write (AOF, `appendfsync always`), SIGSTOP and
//!   SIGCONT;
//! - on the network, through an in-process TCP proxy in front of each server: added delay,
//!   blackhole (accepted, never forwarded), replies dropped after the server ran the command,
//!   connection resets;
//! - on the clients: holders that sleep past their validity (and check it before writing).
//!
//! Mutex contenders do a read-modify-write of a counter under the lock; read-write contenders
//! (read- and write-preferring) read it under a read lock and increment it under a write lock.
//! The shared history checker must find no overlapping windows (readers may overlap readers,
//! writers nothing) and no lost write made inside a lock's window, and no lock key may be left
//! once everyone released (keys that a faulty link kept a release from reaching must be gone
//! within their TTL). A holder checks its validity before it writes, but its thread may lose
//! the processor in between and write after its window: such writes, and the updates they
//! wipe out, are reported and are no lock's fault.
//!
//! Windows are recorded on the wall clock (`SystemTime`, in µs from a shared origin), which is
//! one clock for every process on the host; a window starts after the grant returned and ends
//! before the release is sent, so it lies inside the lock's real hold.

mod common;
use redlock_mux_kit::fault_proxy;
use redlock_mux_kit::history;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{RedisCluster, RedisServer};
use fault_proxy::{FaultProxy, ProxyFault};
use history::{History, Increment, Kind, Op};
use redlock_mux::{Client, RwPolicy};

const TTL: Duration = Duration::from_millis(300);
const KEY: &[u8] = b"fault:counter";
const THREADS: u64 = 4;
const RUN_FOR: Duration = Duration::from_millis(1200);
/// The proxy's added delay: past the client's 20 ms node timeout, so late replies pile up.
const PROXY_DELAY: Duration = Duration::from_millis(25);

/// The one clock of every contender, threads and processes alike.
#[derive(Clone, Copy)]
struct Clock {
    origin_us: u64,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            origin_us: wall_us(),
        }
    }

    fn now(self) -> Duration {
        Duration::from_micros(wall_us().saturating_sub(self.origin_us))
    }
}

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// The counter the holders increment: a file, so that processes share it.
#[derive(Clone)]
struct Counter(PathBuf);

impl Counter {
    fn new(dir: &Path) -> Counter {
        let c = Counter(dir.join("counter"));
        c.write(0);
        c
    }

    fn read(&self) -> u64 {
        let text = std::fs::read_to_string(&self.0).expect("read the counter");
        match text.trim().parse() {
            Ok(v) => v,
            Err(_) => panic!("the counter holds {text:?}"),
        }
    }

    /// Replaces the file whole (written aside, then renamed over it), so that a reader in any
    /// process sees the old value or the new one, never a file half written.
    fn write(&self, v: u64) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let aside = self.0.with_extension(format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&aside, v.to_string()).expect("write the counter");
        std::fs::rename(&aside, &self.0).expect("replace the counter");
    }
}

/// What the contenders take.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Locks {
    Mutex,
    ReadWrite(RwPolicy),
}

/// A held lock of any kind.
enum Held {
    Mutex(redlock_mux::Lock),
    Read(redlock_mux::ReadLock),
    Write(redlock_mux::WriteLock),
}

impl Held {
    fn validity(&self) -> Duration {
        match self {
            Held::Mutex(l) => l.validity(),
            Held::Read(l) => l.validity(),
            Held::Write(l) => l.validity(),
        }
    }

    fn release(self) {
        let _ = match self {
            Held::Mutex(l) => l.release(),
            Held::Read(l) => l.release(),
            Held::Write(l) => l.release(),
        };
    }
}

fn client(urls: Vec<String>, locks: Locks) -> Client {
    let mut b = Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(20))
        .retry_delay(Duration::from_millis(10))
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(2));
    if let Locks::ReadWrite(policy) = locks {
        b = b.rw_policy(policy);
    }
    b.build().expect("client")
}

/// One contender: takes the lock again and again until `until`, and records what it did.
#[allow(clippy::too_many_arguments)]
fn contender(
    client: &Client,
    id: u64,
    locks: Locks,
    clock: Clock,
    counter: &Counter,
    until: Duration,
    overstay: bool,
    ttl: Duration,
) -> History {
    let mut h = History::default();
    let mut n = 0u64;
    while clock.now() < until {
        n += 1;
        let kind = match locks {
            Locks::Mutex => Kind::Mutex,
            // Three reads for every two writes, spread over the contenders.
            Locks::ReadWrite(_) if (n + id) % 5 < 3 => Kind::Read,
            Locks::ReadWrite(_) => Kind::Write,
        };
        let invoke = clock.now();
        let held = match kind {
            Kind::Mutex => client.lock(KEY, ttl).map(Held::Mutex),
            Kind::Read => client.read_lock(KEY, ttl).map(Held::Read),
            Kind::Write => client.write_lock(KEY, ttl).map(Held::Write),
            Kind::Permit { .. } => unreachable!("no semaphore here"),
        };
        let Ok(held) = held else {
            continue;
        };
        let validity = held.validity();
        let ok = clock.now();
        let op = h.push(Op {
            client: id,
            kind,
            key: KEY.to_vec(),
            invoke,
            ok: Some(ok),
            fence: None,
            // Measured after the grant, so never later than the lock's own.
            valid_until: Some(ok + validity),
            release: None,
        });
        // A read-modify-write that loses updates unless writers exclude each other.
        let read = counter.read();
        let pause = if overstay && invoke.as_millis() % 3 == 0 {
            ttl
        } else {
            Duration::from_millis(2)
        };
        thread::sleep(pause);
        // Check the validity before writing, then write at once. The write is stamped when it
        // is done: a thread descheduled between the check and the write (a loaded machine)
        // writes after its window, which no lock can prevent, and the check below tells that
        // apart from a lock that let two holders in.
        if kind != Kind::Read && held.validity() > Duration::ZERO {
            counter.write(read + 1);
            h.increments.push(Increment {
                client: id,
                key: KEY.to_vec(),
                read,
                at: clock.now(),
                op,
            });
        }
        h.ops[op].release = Some(clock.now());
        held.release();
    }
    h
}

/// Runs [`THREADS`] contenders in this process until `until`.
fn contenders(
    urls: &[String],
    locks: Locks,
    clock: Clock,
    counter: &Counter,
    until: Duration,
    overstay: bool,
    first_id: u64,
) -> Vec<thread::JoinHandle<History>> {
    contenders_sharing(
        urls, locks, clock, counter, until, overstay, first_id, THREADS,
    )
}

/// Runs `threads` contenders in this process until `until`, all sharing one client (and so
/// its one connection per node).
#[allow(clippy::too_many_arguments)]
fn contenders_sharing(
    urls: &[String],
    locks: Locks,
    clock: Clock,
    counter: &Counter,
    until: Duration,
    overstay: bool,
    first_id: u64,
    threads: u64,
) -> Vec<thread::JoinHandle<History>> {
    let client = client(urls.to_vec(), locks);
    (0..threads)
        .map(|i| {
            let (client, counter) = (client.clone(), counter.clone());
            thread::spawn(move || {
                contender(
                    &client,
                    first_id + i,
                    locks,
                    clock,
                    &counter,
                    until,
                    overstay,
                    TTL,
                )
            })
        })
        .collect()
}

/// Injects a fault about every 150 ms until `until` (`inject` gets the fault's number and
/// returns after undoing it) and returns how many it injected.
fn inject_until(clock: Clock, until: Duration, mut inject: impl FnMut(u32)) -> u32 {
    let mut faults = 0;
    while clock.now() + Duration::from_millis(150) < until {
        thread::sleep(Duration::from_millis(150));
        inject(faults);
        faults += 1;
    }
    faults
}

/// Joins the contenders and checks their merged history: no overlap, no lost write inside a
/// window, some grants, then no lock key left on any server.
fn check(
    what: &str,
    workers: Vec<thread::JoinHandle<History>>,
    extra: Vec<History>,
    counter: &Counter,
    faults: u32,
    servers: &[&RedisServer],
) -> history::Report {
    let mut h = History::default();
    for w in workers {
        h.merge(w.join().expect("contender panicked"));
    }
    for e in extra {
        h.merge(e);
    }
    h.counters.insert(KEY.to_vec(), (0, counter.read()));
    let report = h.check();
    let reads = h.ops.iter().filter(|o| o.kind == Kind::Read).count();
    println!("{what}: {faults} faults injected, {reads} of the ops reads; {report}");
    assert!(faults > 0, "{what}: no fault was injected");
    assert!(report.windows > 0, "{what}: nobody got the lock: {report}");
    assert!(report.increments > 0, "{what}: nobody wrote: {report}");
    if let Err(why) = judge(&report) {
        panic!("{what}: {why}");
    }
    // Everyone released. A release a fault kept from a node leaves the key there until its TTL.
    for server in servers {
        let addr = server.addr();
        let gone = common::eventually(TTL + Duration::from_millis(500), || {
            !common::keys(addr)
                .iter()
                .any(|k| k.starts_with(b"fault:") || k.starts_with(b"{rw:fault:"))
        });
        assert!(gone, "{what}: {addr} still holds {:?}", common::keys(addr));
    }
    report
}

/// What the locks are to blame for in `report`, if anything.
fn judge(report: &history::Report) -> Result<(), String> {
    // No two holders at once, and no write made inside a window lost. A write a descheduled
    // thread made after its window (it checked its validity, then lost the processor) can
    // wipe out any number of increments made meanwhile: those show in the report, and are no
    // lock's fault.
    match report.lock_violations() {
        0 => Ok(()),
        _ => Err(report.to_string()),
    }
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "redlock-mux-faults-{}-{what}-{}",
        std::process::id(),
        wall_us()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[derive(Clone, Copy, Debug)]
enum ServerFault {
    /// kill -9 of node 0, restarted after longer than the TTL.
    KillAndDelayedRestart,
    /// SIGSTOP of node 1 for about a TTL, then SIGCONT.
    StopAndContinue,
    /// Every holder sometimes sleeps past its validity, then checks before it writes.
    HoldPastValidity,
}

#[test]
fn no_overlap_or_lost_update_under_node_faults() {
    let mut cluster = RedisCluster::start(3).expect("start redis-server");
    let dir = temp_dir("node");
    for fault in [
        ServerFault::KillAndDelayedRestart,
        ServerFault::StopAndContinue,
        ServerFault::HoldPastValidity,
    ] {
        let counter = Counter::new(&dir);
        let clock = Clock::start();
        let overstay = matches!(fault, ServerFault::HoldPastValidity);
        let children = spawn_processes(&cluster.urls(), clock, &counter, &dir);
        let workers = contenders(
            &cluster.urls(),
            Locks::Mutex,
            clock,
            &counter,
            RUN_FOR,
            overstay,
            0,
        );
        let faults = inject_until(clock, RUN_FOR, |_| match fault {
            ServerFault::KillAndDelayedRestart => {
                cluster.servers[0].kill().expect("kill -9");
                thread::sleep(TTL + Duration::from_millis(100));
                cluster.servers[0].restart().expect("restart");
            }
            ServerFault::StopAndContinue => {
                cluster.servers[1].pause().expect("SIGSTOP");
                thread::sleep(TTL);
                cluster.servers[1].resume().expect("SIGCONT");
            }
            ServerFault::HoldPastValidity => thread::sleep(Duration::from_millis(50)),
        });
        let extra = join_processes(children);
        let servers: Vec<&RedisServer> = cluster.servers.iter().collect();
        check(
            &format!("{fault:?}"),
            workers,
            extra,
            &counter,
            faults,
            &servers,
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Three servers, each behind its own fault proxy.
struct Proxied {
    cluster: RedisCluster,
    proxies: Vec<FaultProxy>,
}

impl Proxied {
    fn start() -> Proxied {
        let cluster = RedisCluster::start(3).expect("start redis-server");
        let proxies = cluster
            .addrs()
            .into_iter()
            .map(|a| FaultProxy::start(a, PROXY_DELAY).expect("start the proxy"))
            .collect();
        Proxied { cluster, proxies }
    }

    fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }

    fn servers(&self) -> Vec<&RedisServer> {
        self.cluster.servers.iter().collect()
    }

    /// Applies `fault` to one link at a time, in turn, for 100 ms each.
    fn rotate(&self, clock: Clock, fault: ProxyFault) -> u32 {
        let faults = inject_until(clock, RUN_FOR, |i| {
            let p = &self.proxies[i as usize % self.proxies.len()];
            p.set(fault);
            thread::sleep(Duration::from_millis(100));
            p.set(ProxyFault::None);
        });
        let hits: u64 = self.proxies.iter().map(FaultProxy::hits).sum();
        assert!(hits > 0, "{fault:?}: the proxies never acted");
        faults
    }

    /// Contenders taking `locks` while [`rotate`](Self::rotate) applies `fault`, checked.
    fn contend(&self, what: &str, locks: Locks, fault: ProxyFault, dir: &Path) -> history::Report {
        self.contend_sharing(what, locks, fault, dir, THREADS)
    }

    /// Like [`contend`](Self::contend), with `threads` threads sharing this process's client.
    fn contend_sharing(
        &self,
        what: &str,
        locks: Locks,
        fault: ProxyFault,
        dir: &Path,
        threads: u64,
    ) -> history::Report {
        let counter = Counter::new(dir);
        let clock = Clock::start();
        // The contender processes take the mutex; read-write runs, and runs with many threads
        // (which load the machine enough already), are threads only.
        let children = match locks {
            Locks::Mutex if threads <= THREADS => {
                spawn_processes(&self.urls(), clock, &counter, dir)
            }
            _ => Vec::new(),
        };
        let workers = contenders_sharing(
            &self.urls(),
            locks,
            clock,
            &counter,
            RUN_FOR,
            false,
            0,
            threads,
        );
        let faults = self.rotate(clock, fault);
        let extra = join_processes(children);
        check(what, workers, extra, &counter, faults, &self.servers())
    }
}

#[test]
fn no_overlap_or_lost_update_under_network_faults() {
    let proxied = Proxied::start();
    let dir = temp_dir("net");
    for fault in [
        ProxyFault::Delay,
        ProxyFault::Blackhole,
        ProxyFault::DropReplies,
        ProxyFault::Reset,
    ] {
        proxied.contend(&format!("{fault:?}"), Locks::Mutex, fault, &dir);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Sixteen threads share each client, so each connection carries many callers' commands at
/// once: a delayed, blackholed or reset link, or replies dropped on it, must never hand one
/// caller's reply to another (a reconnect fails every reply the connection owed, for its
/// owner), and the locks still exclude.
#[test]
fn sixteen_threads_sharing_each_client_under_network_faults() {
    let proxied = Proxied::start();
    let dir = temp_dir("shared");
    for fault in [
        ProxyFault::Delay,
        ProxyFault::DropReplies,
        ProxyFault::Reset,
    ] {
        proxied.contend_sharing(
            &format!("16 threads, {fault:?}"),
            Locks::Mutex,
            fault,
            &dir,
            16,
        );
    }
    let what = "16 threads, read-write under Reset";
    let policy = RwPolicy::WritePreferring;
    let report =
        proxied.contend_sharing(what, Locks::ReadWrite(policy), ProxyFault::Reset, &dir, 16);
    assert!(
        report.windows > report.increments,
        "{what}: no reader got in: {report}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Readers share, writers exclude everyone, under dropped replies and resets, with each
/// policy.
#[test]
fn read_write_locks_hold_their_rules_under_network_faults() {
    let proxied = Proxied::start();
    let dir = temp_dir("rw");
    for (policy, fault) in [
        (RwPolicy::ReadPreferring, ProxyFault::DropReplies),
        (RwPolicy::WritePreferring, ProxyFault::Reset),
    ] {
        let what = format!("{policy:?} under {fault:?}");
        let report = proxied.contend(&what, Locks::ReadWrite(policy), fault, &dir);
        assert!(
            report.windows > report.increments,
            "{what}: no reader got in: {report}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// kill -9 and restart at once. Without persistence that breaks Redlock (the restarted node
/// grants the key again); with every write fsynced before it is acknowledged, the key survives
/// the crash and the lock holds.
#[test]
fn immediate_restart_of_a_server_that_fsyncs_every_write() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&aof).expect("start redis-server"))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let dir = temp_dir("aof");
    let counter = Counter::new(&dir);
    let clock = Clock::start();
    let children = spawn_processes(&urls, clock, &counter, &dir);
    let workers = contenders(&urls, Locks::Mutex, clock, &counter, RUN_FOR, false, 0);
    let faults = inject_until(clock, RUN_FOR, |i| {
        let s = &mut servers[i as usize % 3];
        s.kill().expect("kill -9");
        s.restart().expect("restart");
    });
    let refs: Vec<&RedisServer> = servers.iter().collect();
    let extra = join_processes(children);
    check(
        "ImmediateRestartWithAof",
        workers,
        extra,
        &counter,
        faults,
        &refs,
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Environment of a contender process.
const CHILD: &str = "REDLOCK_FAULTS_CHILD";

/// Contender processes (this test binary again, in child mode) and threads of this one share
/// the lock and the counter while the links reset and a server is stopped and continued.
#[test]
fn processes_contend_under_faults() {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec);
    }
    let proxied = Proxied::start();
    let dir = temp_dir("procs");
    let counter = Counter::new(&dir);
    let clock = Clock::start();
    let urls = proxied.urls();
    let children = spawn_processes(&urls, clock, &counter, &dir);
    let workers = contenders(&urls, Locks::Mutex, clock, &counter, RUN_FOR, false, 0);
    let faults = inject_until(clock, RUN_FOR, |i| {
        if i % 2 == 0 {
            let p = &proxied.proxies[(i as usize / 2) % 3];
            p.set(ProxyFault::Reset);
            thread::sleep(Duration::from_millis(50));
            p.set(ProxyFault::None);
        } else {
            let s = &proxied.cluster.servers[(i as usize / 2) % 3];
            s.pause().expect("SIGSTOP");
            thread::sleep(Duration::from_millis(100));
            s.resume().expect("SIGCONT");
        }
    });
    let extra = join_processes(children);
    let processes_ops: usize = extra.iter().map(|h| h.ops.len()).sum();
    let report = check(
        "ProcessesAndThreads",
        workers,
        extra,
        &counter,
        faults,
        &proxied.servers(),
    );
    assert!(
        processes_ops > 0,
        "the contender processes got nothing: {report}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Contender processes per scenario, besides the threads of this one.
const PROCESSES: u64 = 2;

/// Starts [`PROCESSES`] contender processes (this test binary again, in child mode) taking the
/// mutex through `urls` for [`RUN_FOR`], on the shared `clock` and `counter`.
fn spawn_processes(
    urls: &[String],
    clock: Clock,
    counter: &Counter,
    dir: &Path,
) -> Vec<(Child, PathBuf)> {
    (1..=PROCESSES)
        .map(|p| {
            let out = dir.join(format!("history-{p}-{}", clock.origin_us));
            let spec = format!(
                "{}|{}|{}|{}|{}",
                p * 100,
                clock.origin_us,
                counter.0.display(),
                out.display(),
                urls.join(",")
            );
            let child = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "processes_contend_under_faults", "--nocapture"])
                .env(CHILD, spec)
                .spawn()
                .expect("spawn a contender process");
            (child, out)
        })
        .collect()
}

/// Waits (bounded) for the contender processes and reads back their histories.
fn join_processes(children: Vec<(Child, PathBuf)>) -> Vec<History> {
    let mut histories = Vec::new();
    for (mut child, out) in children {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("a contender process did not finish");
            }
            thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "a contender process failed: {status}");
        let text = std::fs::read_to_string(&out).expect("a contender's history");
        histories.push(parse_history(&text));
    }
    histories
}

/// A contender process: `first id|origin µs|counter file|history file|urls`.
fn child(spec: &str) {
    let parts: Vec<&str> = spec.split('|').collect();
    let [id, origin, counter, out, urls] = parts[..] else {
        panic!("bad contender spec {spec:?}");
    };
    let clock = Clock {
        origin_us: origin.parse().expect("origin"),
    };
    let counter = Counter(PathBuf::from(counter));
    let urls: Vec<String> = urls.split(',').map(str::to_string).collect();
    let workers = contenders(
        &urls,
        Locks::Mutex,
        clock,
        &counter,
        RUN_FOR,
        false,
        id.parse().expect("id"),
    );
    let mut h = History::default();
    for w in workers {
        h.merge(w.join().expect("contender panicked"));
    }
    std::fs::write(out, format_history(&h)).expect("write the history");
}

/// One line per op (`op client ok_us valid_us release_us`; `-` for none) and per increment
/// (`inc client read at_us op`). Only mutex ops cross processes.
fn format_history(h: &History) -> String {
    let us = |d: Option<Duration>| d.map_or("-".to_string(), |d| d.as_micros().to_string());
    let mut out = String::new();
    for op in &h.ops {
        out += &format!(
            "op {} {} {} {} {}\n",
            op.client,
            op.invoke.as_micros(),
            us(op.ok),
            us(op.valid_until),
            us(op.release)
        );
    }
    for i in &h.increments {
        out += &format!(
            "inc {} {} {} {}\n",
            i.client,
            i.read,
            i.at.as_micros(),
            i.op
        );
    }
    out
}

fn parse_history(text: &str) -> History {
    let us = |s: &str| -> Option<Duration> {
        (s != "-").then(|| Duration::from_micros(s.parse().expect("µs")))
    };
    let mut h = History::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            ["op", client, invoke, ok, valid, release] => {
                h.push(Op {
                    client: client.parse().expect("client"),
                    kind: Kind::Mutex,
                    key: KEY.to_vec(),
                    invoke: us(invoke).expect("invoke"),
                    ok: us(ok),
                    fence: None,
                    valid_until: us(valid),
                    release: us(release),
                });
            }
            ["inc", client, read, at, op] => h.increments.push(Increment {
                client: client.parse().expect("client"),
                key: KEY.to_vec(),
                read: read.parse().expect("read"),
                at: us(at).expect("at"),
                op: op.parse().expect("op"),
            }),
            _ => panic!("bad history line {line:?}"),
        }
    }
    h
}

/// A mutex op granted at `ok` ms, valid for `ms` ms, released at its end.
fn synthetic_op(h: &mut History, client: u64, ok: u64, ms: u64) -> usize {
    let at = |t: u64| Duration::from_millis(t);
    h.push(Op {
        client,
        kind: Kind::Mutex,
        key: KEY.to_vec(),
        invoke: at(ok),
        ok: Some(at(ok)),
        fence: None,
        valid_until: Some(at(ok + ms)),
        release: Some(at(ok + ms)),
    })
}

/// A history of one key in which every holder but one wrote inside its window, and one, whose
/// thread was descheduled past its validity after reading 5, wrote 6 once 160 increments had
/// been made meanwhile: they are all lost, yet no lock let two holders in. The check tells
/// the late write apart from a lost write inside a window, and still finds the latter.
#[test]
fn one_late_write_that_wipes_out_many_increments_is_told_apart_from_a_lost_one() {
    let inc = |h: &mut History, client: u64, read: u64, at: u64, op: usize| {
        h.increments.push(Increment {
            client,
            key: KEY.to_vec(),
            read,
            at: Duration::from_millis(at),
            op,
        });
    };
    let mut h = History::default();
    let mut value = 0;
    let mut t = 0;
    let holder = |h: &mut History, value: &mut u64, t: &mut u64| {
        let op = synthetic_op(h, 1 + *t % 15, *t, 2);
        inc(h, 1 + *t % 15, *value, *t + 1, op);
        *value += 1;
        *t += 3;
    };
    for _ in 0..5 {
        holder(&mut h, &mut value, &mut t);
    }
    // The late writer read 5 in its window [15, 17] and writes 6 at 1000.
    let late = synthetic_op(&mut h, 16, t, 2);
    t += 3;
    for _ in 0..160 {
        holder(&mut h, &mut value, &mut t);
    }
    t = t.max(1001);
    inc(&mut h, 16, 5, 1000, late);
    value = 6;
    for _ in 0..10 {
        holder(&mut h, &mut value, &mut t);
    }
    h.counters.insert(KEY.to_vec(), (0, value));
    let report = h.check();
    assert_eq!(
        (report.lost_updates, report.writes_outside),
        (160, 1),
        "{report}"
    );
    assert_eq!(judge(&report), Ok(()), "{report}");

    // Without the late write, a holder that read a stale value inside its window loses the
    // increment before it: the lock let it in while the other's write was not yet seen.
    let mut h = History::default();
    let a = synthetic_op(&mut h, 1, 0, 10);
    let b = synthetic_op(&mut h, 2, 10, 10);
    inc(&mut h, 1, 0, 5, a);
    inc(&mut h, 2, 0, 15, b);
    h.counters.insert(KEY.to_vec(), (0, 1));
    assert!(judge(&h.check()).is_err(), "{}", h.check());
}

/// Holders in several processes share the counter file, and a holder that writes late (after
/// its window) may write while another reads: a reader must see one whole value, never a file
/// half written (which it would read as no value at all).
#[test]
fn the_counter_file_is_never_read_half_written() {
    let dir = temp_dir("counter");
    let counter = Counter::new(&dir);
    const BASE: u64 = 1_000_000;
    counter.write(BASE);
    let deadline = Instant::now() + Duration::from_secs(2);
    let writer = {
        let counter = counter.clone();
        thread::spawn(move || {
            for v in BASE..BASE + 20_000 {
                if Instant::now() > deadline {
                    break;
                }
                counter.write(v);
            }
        })
    };
    let mut reads = 0;
    let mut torn = 0;
    while !writer.is_finished() && reads < 200_000 {
        if counter.read() < BASE {
            torn += 1;
        }
        reads += 1;
    }
    writer.join().expect("the writer");
    assert_eq!(torn, 0, "{torn} of {reads} reads found no whole value");
    let _ = std::fs::remove_dir_all(dir);
}

/// Sixteen threads share one client and take read and write locks on three nodes while the
/// servers close the client's connections every 150 ms (`CLIENT KILL TYPE normal`, as a network
/// blip, an idle timeout or a restart would): no two holders, and no writer key or reader entry
/// left once every lock was released, although the TTL is long. A release whose connection was
/// closed before it was answered is sent again on the next connection. On Redis 7.0, and on the
/// server `REDLOCK_MUX_REDIS_SERVER` names (Redis 8.2 in CI's second pass, where readers are
/// hash fields).
#[test]
fn nothing_is_left_behind_when_the_servers_keep_closing_the_connections() {
    const LONG_TTL: Duration = Duration::from_secs(20);
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let dir = temp_dir("killed");
    let counter = Counter::new(&dir);
    let clock = Clock::start();
    let locks = Locks::ReadWrite(RwPolicy::ReadPreferring);
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .retry_delay(Duration::from_millis(10))
        .wait_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let workers: Vec<_> = (0..16)
        .map(|i| {
            let (client, counter) = (client.clone(), counter.clone());
            thread::spawn(move || {
                contender(&client, i, locks, clock, &counter, RUN_FOR, false, LONG_TTL)
            })
        })
        .collect();
    let addrs = cluster.addrs();
    let faults = inject_until(clock, RUN_FOR, |_| {
        for &addr in &addrs {
            common::cmd(addr, &[b"CLIENT", b"KILL", b"TYPE", b"normal"]);
        }
    });
    let mut h = History::default();
    for w in workers {
        h.merge(w.join().expect("contender panicked"));
    }
    h.counters.insert(KEY.to_vec(), (0, counter.read()));
    let report = h.check();
    println!("16 threads, connections closed every 150 ms: {faults} kills; {report}");
    assert!(report.windows > 0, "nobody got the lock: {report}");
    if let Err(why) = judge(&report) {
        panic!("{why}");
    }
    // Every lock was released (or its release reported failed): nothing may stay until the
    // 20 s TTL. The releases sent again need a reconnect or two.
    for &addr in &addrs {
        let clean = common::eventually(Duration::from_secs(3), || {
            !common::keys(addr)
                .iter()
                .any(|k| k.starts_with(b"fault:") || k.starts_with(b"{rw:fault:"))
        });
        let left: Vec<String> = common::keys(addr)
            .iter()
            .map(|k| {
                format!(
                    "{} ({}, PTTL {} ms)",
                    String::from_utf8_lossy(k),
                    common::show(&common::cmd(addr, &[b"TYPE", k])),
                    common::pttl(addr, k)
                )
            })
            .collect();
        assert!(
            clean,
            "{addr} still holds {left:?} after every release returned"
        );
    }
    drop(client);
    let _ = std::fs::remove_dir_all(dir);
}
