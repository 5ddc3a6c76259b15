//! Heap allocations per lock operation once warmed up, counted by a global allocator.
//!
//! The target is zero for every kind of lock (mutex, read and write lock, fenced mutex and
//! fenced write lock, semaphore permit, all-or-none set), with keys of any length up to
//! `MAX_KEY_LEN`, for the acquire + release cycle and for extends, with one thread; and for the
//! mutex with sixteen threads sharing one client (and so its connections, the leader/follower
//! polling and the callers' mailboxes). The tests fail if a change adds allocations to the
//! steady state over real redis-servers (whichever `REDLOCK_MUX_REDIS_SERVER` names, Redis 7.0
//! by default); they print the figures they measured.
//!
//! With `REDLOCK_MUX_ALLOC_TRACE=1` the single-threaded tests also print where the allocations of
//! each counted phase were made (the library's frames of their backtraces).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{kind, Client, Error, Guard, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS};

// A global allocator must be an `unsafe impl`. This file is a test, not the library (which
// forbids unsafe code outside its FFI module); the impl only counts, then defers to `System`.
struct Counting;

thread_local! {
    /// Allocations made by this thread while counting is on (`None`: off). Thread-local so that
    /// the test harness's own threads do not disturb the figure.
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
}

thread_local! {
    /// This thread adds its allocations to [`SHARED`].
    static SHARED_ON: Cell<bool> = const { Cell::new(false) };
}

/// Allocations of every thread that has [`SHARED_ON`] set.
static SHARED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Backtraces of the first allocations counted on this thread, when tracing.
    static TRACES: RefCell<Vec<Backtrace>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread records [`TRACES`].
    static TRACING: Cell<bool> = const { Cell::new(false) };
    /// Set while a backtrace is taken: its own allocations are neither counted nor traced.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// How many allocations of one counted phase are traced, at most: all of them, in every phase
/// that passes.
const TRACE_LIMIT: usize = 4000;

fn note_allocation() {
    if IN_TRACE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    // `try_with`: the slot may already be gone while a thread exits.
    let mut counted = false;
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
            counted = true;
        }
    });
    if counted && TRACING.try_with(Cell::get).unwrap_or(false) {
        IN_TRACE.with(|t| t.set(true));
        TRACES.with(|traces| {
            let mut traces = traces.borrow_mut();
            if traces.len() < TRACE_LIMIT {
                traces.push(Backtrace::force_capture());
            }
        });
        IN_TRACE.with(|t| t.set(false));
    }
    if SHARED_ON.try_with(Cell::get).unwrap_or(false) {
        SHARED.fetch_add(1, Ordering::Relaxed);
    }
}

#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as for `alloc`; `ptr` came from this allocator, which is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations (including reallocations) that `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(Some(0)));
    f();
    COUNT.with(|c| c.replace(None)).unwrap_or(0)
}

/// Makes the client's resender exist before anything is counted: a release that returns at its
/// quorum while a node still owes its reply wakes the thread that sees such releases through,
/// and starts it the first time (a thread's start allocates on the thread that starts it).
/// Once started it stays, parked, while the client is used. Warm means that thread too.
fn start_resender(client: &Client, cluster: &RedisCluster) {
    let addr = cluster.addrs()[0];
    cmd(addr, &[b"CLIENT", b"PAUSE", b"150", b"WRITE"]);
    if let Ok(lock) = client.try_lock("alloc:resender", Duration::from_secs(10)) {
        let _ = lock.release();
    }
    // The paused node answers, the resender sees the release through and parks.
    std::thread::sleep(Duration::from_millis(400));
}

const CYCLES: u64 = 1000;

/// Allocations in all `CYCLES` steady-state acquire+release cycles, at most: a handful, as the
/// README promises, none of them per cycle (a cost per cycle would show as 1000 or more).
const MAX_TOTAL: u64 = 10;

/// Prints where the allocations traced in a counted phase were made (the library's frames),
/// with how many were made there.
fn print_traces(traces: &[Backtrace]) {
    let mut sites: Vec<(usize, String)> = Vec::new();
    for trace in traces {
        let frames = our_frames(&trace.to_string());
        match sites.iter_mut().find(|(_, s)| *s == frames) {
            Some((n, _)) => *n += 1,
            None => sites.push((1, frames)),
        }
    }
    for (n, site) in &sites {
        println!("    {n} traced allocations in:\n{site}");
    }
}

#[test]
fn steady_state_acquire_and_release_do_not_allocate() {
    let cluster = RedisCluster::start(5).unwrap();
    // A generous node timeout: on a loaded machine a timed-out node would take the error path,
    // which allocates (it names the failed nodes), and this test is about the normal path.
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    start_resender(&client, &cluster);
    let ttl = Duration::from_secs(10);
    let cycle = || {
        let lock = client.try_lock("alloc:key", ttl).unwrap();
        lock.release().unwrap();
    };
    // Warm-up: connections, script loads, buffers grown to size.
    for _ in 0..200 {
        cycle();
    }
    let tracing = std::env::var_os("REDLOCK_MUX_ALLOC_TRACE").is_some();
    TRACING.with(|t| t.set(tracing));
    let total = allocations(|| {
        for _ in 0..CYCLES {
            cycle();
        }
    });
    TRACING.with(|t| t.set(false));
    let per_cycle = total as f64 / CYCLES as f64;
    println!("steady state: {total} allocations in {CYCLES} acquire+release cycles at N=5 ({per_cycle:.2} per cycle)");
    print_traces(&TRACES.with(|t| std::mem::take(&mut *t.borrow_mut())));
    assert!(
        total <= MAX_TOTAL,
        "{total} allocations in {CYCLES} acquire+release cycles ({per_cycle:.2} per cycle)"
    );
    // Once `close` returns, every node has answered every release (a node may be behind the
    // last ones: the releases returned at their quorum).
    client.close().unwrap();
    for addr in cluster.addrs() {
        assert_eq!(dbsize(addr), 0, "the lock was left on {addr}");
    }
}

const THREADS: usize = 16;
const CYCLES_PER_THREAD: u64 = 300;

/// Allocations in all `THREADS * CYCLES_PER_THREAD` steady-state cycles of sixteen threads
/// sharing one client, at most: as above, a buffer or queue may grow once more to a new
/// high-water mark (more callers' commands in flight at once than during the warm-up); a cost
/// per cycle would show as 4800 or more.
const MAX_TOTAL_SHARED: u64 = 32;

#[test]
fn sixteen_threads_sharing_a_client_do_not_allocate_in_steady_state() {
    let cluster = RedisCluster::start(5).unwrap();
    // As above: a generous node timeout keeps a loaded machine off the error path.
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    start_resender(&client, &cluster);
    let ttl = Duration::from_secs(10);
    let start = Arc::new(Barrier::new(THREADS));
    let stop = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (client, start, stop) = (client.clone(), start.clone(), stop.clone());
            std::thread::spawn(move || {
                let key = format!("alloc:shared:{t}");
                let cycle = || {
                    let lock = client.try_lock(&key, ttl).unwrap();
                    lock.release().unwrap();
                };
                // Warm-up: connections, caller slots, buffers and queues grown to size.
                for _ in 0..200 {
                    cycle();
                }
                start.wait();
                SHARED_ON.with(|c| c.set(true));
                for _ in 0..CYCLES_PER_THREAD {
                    cycle();
                }
                SHARED_ON.with(|c| c.set(false));
                // Nobody stops counting while another thread may still lead for it.
                stop.wait();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let total = SHARED.load(Ordering::Relaxed);
    let cycles = THREADS as u64 * CYCLES_PER_THREAD;
    let per_cycle = total as f64 / cycles as f64;
    println!("steady state, {THREADS} threads sharing one client: {total} allocations in {cycles} acquire+release cycles at N=5 ({per_cycle:.3} per cycle)");
    assert!(
        total <= MAX_TOTAL_SHARED,
        "{total} allocations in {cycles} acquire+release cycles ({per_cycle:.3} per cycle)"
    );
    // As above: every node has answered every release once `close` returns.
    client.close().unwrap();
    for addr in cluster.addrs() {
        assert_eq!(dbsize(addr), 0, "the lock was left on {addr}");
    }
}

/// Acquire + release cycles (and extends) counted per kind and key, after a warm-up of as many.
const KIND_CYCLES: u64 = 200;

/// The same with keys of `MAX_KEY_LEN` bytes: each cycle sends a few hundred KiB to every node.
const LONG_KEY_CYCLES: u64 = 40;

/// Allocations per counted phase that are not per cycle, at most: a buffer or queue of the
/// connections that grows once to a new high-water mark (replies owed by a node that fell
/// behind, a backlog of commands of `MAX_KEY_LEN` keys). Measured: 0 to 4, more often with
/// tracing, which slows the client. A cost per cycle would show as the number of cycles (40 or
/// 200) or more.
const SLACK: u64 = 8;

/// Nodes of the per-kind test.
const NODES: u64 = 3;

/// The kinds of lock the per-kind test takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Mutex,
    Read,
    Write,
    Fenced,
    FencedWrite,
    Permit,
    /// A permit of a semaphore with one slot per node: one key per node.
    KeyPermit,
    All,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Mutex => "mutex",
            Case::Read => "read lock",
            Case::Write => "write lock",
            Case::Fenced => "fenced lock",
            Case::FencedWrite => "fenced write lock",
            Case::Permit => "semaphore permit",
            Case::KeyPermit => "one-slot semaphore permit",
            Case::All => "lock_all",
        }
    }
}

/// What one counted phase cost.
#[derive(Default)]
struct Phase {
    /// Allocations made.
    total: u64,
    /// When tracing: how many of the traced allocations were made decoding replies, and how
    /// many elsewhere.
    decoding: Option<(u64, u64)>,
}

/// What one kind of lock cost in its counted phases.
struct Figures {
    case: Case,
    label: String,
    cycles: u64,
    /// `cycles` acquire + release cycles.
    cycle: Phase,
    /// `cycles` extends of one held lock.
    extend: Phase,
    /// Where the traced allocations were made (the library's frames), with how many of them
    /// were made there.
    sites: Vec<(usize, String)>,
}

/// Whether the library frames of an allocation's backtrace show it was made decoding a reply.
fn decoding(site: &str) -> bool {
    site.contains("redlock_mux::resp::decode")
}

/// Allocations in `cycles` acquire + release cycles of the locks `take` takes, then in
/// `cycles` extends of one of them, each counted after a warm-up of as many.
fn measure<K: kind::Kind>(
    case: Case,
    label: String,
    cycles: u64,
    take: impl Fn() -> Result<Guard<K>, Error>,
) -> Figures {
    let ttl = Duration::from_secs(10);
    let tracing = std::env::var_os("REDLOCK_MUX_ALLOC_TRACE").is_some();
    let mut sites: Vec<(usize, String)> = Vec::new();
    let mut counted = |what: &str, f: &dyn Fn()| {
        TRACES.with(|t| t.borrow_mut().clear());
        TRACING.with(|t| t.set(tracing));
        let total = allocations(f);
        TRACING.with(|t| t.set(false));
        let traces = TRACES.with(|t| std::mem::take(&mut *t.borrow_mut()));
        let mut split = (0, 0);
        for trace in &traces {
            let frames = our_frames(&trace.to_string());
            if decoding(&frames) {
                split.0 += 1;
            } else {
                split.1 += 1;
            }
            let site = format!("in {what}:\n{frames}");
            match sites.iter_mut().find(|(_, s)| *s == site) {
                Some((n, _)) => *n += 1,
                None => sites.push((1, site)),
            }
        }
        Phase {
            total,
            decoding: tracing.then_some(split),
        }
    };
    let cycle = || {
        let lock = take().unwrap_or_else(|e| panic!("{} ({label}): {e}", case.name()));
        lock.release().unwrap();
    };
    for _ in 0..cycles {
        cycle();
    }
    let cycle_phase = counted("acquire+release", &|| {
        for _ in 0..cycles {
            cycle();
        }
    });
    let lock = RefCell::new(take().unwrap());
    let extend = || lock.borrow_mut().extend(ttl).unwrap();
    for _ in 0..cycles {
        extend();
    }
    let extend_phase = counted("extend", &|| {
        for _ in 0..cycles {
            extend();
        }
    });
    lock.into_inner().release().unwrap();
    Figures {
        case,
        label,
        cycles,
        cycle: cycle_phase,
        extend: extend_phase,
        sites,
    }
}

/// The library's frames of a backtrace, innermost first, one line each (at most eight).
fn our_frames(trace: &str) -> String {
    let mut out = String::new();
    let mut lines = trace.lines().peekable();
    let mut frames = 0;
    while let Some(line) = lines.next() {
        let Some((_, name)) = line.trim().split_once(": ") else {
            continue;
        };
        if !name.starts_with("redlock_mux::") && !name.starts_with("<redlock_mux::") {
            continue;
        }
        let at = lines
            .peek()
            .and_then(|l| l.trim().strip_prefix("at "))
            .and_then(|l| l.rsplit_once("/src/").map(|(_, f)| f))
            .unwrap_or("?");
        let _ = writeln!(out, "      {name} (src/{at})");
        frames += 1;
        if frames == 8 {
            break;
        }
    }
    out
}

/// Whether the node has hash-field expiry (`HSETEX`, Redis 8.0): the read-write lock then goes
/// without Lua where it can.
fn native(addr: SocketAddr) -> bool {
    matches!(cmd(addr, &[b"COMMAND", b"INFO", b"HSETEX"]),
        Value::Array(Some(items)) if matches!(items.first(), Some(Value::Array(Some(_)))))
}

/// The node's `redis_version`.
fn version(addr: SocketAddr) -> String {
    match cmd(addr, &[b"INFO", b"server"]) {
        Value::Bulk(Some(text)) => String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_string(),
        _ => "?".to_string(),
    }
}

/// The figures of one phase, as printed.
fn show_phase(p: &Phase, cycles: u64, what: &str) -> String {
    let mut out = format!(
        "{:>5} in {cycles:>3} {what} ({:.2} each",
        p.total,
        p.total as f64 / cycles as f64
    );
    if let Some((decoding, other)) = p.decoding {
        let _ = write!(
            out,
            "; traced: {decoding} decoding replies, {other} elsewhere"
        );
    }
    out.push(')');
    out
}

#[test]
fn every_kind_is_allocation_free_once_warm() {
    let cluster = RedisCluster::start(NODES as usize).unwrap();
    let addr = cluster.addrs()[0];
    let native = native(addr);
    let version = version(addr);
    // As above: a generous node timeout keeps a loaded machine off the error path.
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    start_resender(&client, &cluster);
    let ttl = Duration::from_secs(10);
    let short = b"alloc:kind".to_vec();
    let long = vec![b'k'; MAX_KEY_LEN];
    let mut rows = Vec::new();
    for (label, key, cycles) in [
        ("short key", &short, KIND_CYCLES),
        ("MAX_KEY_LEN key", &long, LONG_KEY_CYCLES),
    ] {
        let label = || label.to_string();
        rows.push(measure(Case::Mutex, label(), cycles, || {
            client.try_lock(key, ttl)
        }));
        rows.push(measure(Case::Read, label(), cycles, || {
            client.try_read_lock(key, ttl)
        }));
        rows.push(measure(Case::Write, label(), cycles, || {
            client.try_write_lock(key, ttl)
        }));
        rows.push(measure(Case::Fenced, label(), cycles, || {
            client.try_lock_fenced(key, ttl)
        }));
        rows.push(measure(Case::FencedWrite, label(), cycles, || {
            client.try_write_lock_fenced(key, ttl)
        }));
        let semaphore = client.semaphore(key, 2).unwrap();
        rows.push(measure(Case::Permit, label(), cycles, || {
            semaphore.try_acquire(ttl)
        }));
        // One permit over 3 nodes: one slot per node, a key, on another key name.
        let mut one_key = key.clone();
        *one_key.last_mut().unwrap() = b'1';
        let one = client.semaphore(&one_key, 1).unwrap();
        assert_eq!(one.slots_per_node(), 1);
        rows.push(measure(Case::KeyPermit, label(), cycles, || {
            one.try_acquire(ttl)
        }));
        // Two keys of this length: the second differs in its last byte.
        let mut other = key.clone();
        *other.last_mut().unwrap() = b'2';
        let pair = [key.clone(), other];
        rows.push(measure(
            Case::All,
            format!("2 of {}", label()),
            cycles,
            || client.try_lock_all(&pair, ttl),
        ));
    }
    let many: Vec<Vec<u8>> = (0..MAX_LOCK_ALL_KEYS)
        .map(|i| format!("alloc:set:{i}").into_bytes())
        .collect();
    rows.push(measure(
        Case::All,
        format!("{MAX_LOCK_ALL_KEYS} short keys"),
        KIND_CYCLES,
        || client.try_lock_all(&many, ttl),
    ));

    println!(
        "allocations once warm, Redis {version} ({}), N={NODES}:",
        if native {
            "hash-field expiry: the read-write lock without Lua"
        } else {
            "scripts"
        }
    );
    let mut failures = Vec::new();
    for r in &rows {
        println!(
            "  {:<25} {:<19} {}, {}",
            r.case.name(),
            r.label,
            show_phase(&r.cycle, r.cycles, "acquire+release cycles"),
            show_phase(&r.extend, r.cycles, "extends"),
        );
        for (n, site) in &r.sites {
            println!("    {n} traced allocations {site}");
        }
        for (what, p) in [("acquire+release cycles", &r.cycle), ("extends", &r.extend)] {
            if p.total > SLACK {
                failures.push(format!(
                    "{} ({}): {} allocations in {} {what}, at most {SLACK} allowed (none per cycle)",
                    r.case.name(),
                    r.label,
                    p.total,
                    r.cycles,
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every node has answered every release once `close` returns: a node may be behind by
    // several cycles of 256-key sets on a loaded machine, which a fixed wait does not bound.
    client.close().unwrap();
    for addr in cluster.addrs() {
        // Fence counters stay, by design; nothing else may.
        let left = || {
            keys(addr)
                .into_iter()
                .filter(|k| !k.starts_with(b"redlock-mux:fence:"))
                .count()
        };
        assert_eq!(left(), 0, "a lock was left on {addr}");
    }
}
