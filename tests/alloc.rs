//! Heap allocations per lock operation once warmed up, counted by a global allocator.
//!
//! The target is zero, with one thread and with sixteen threads sharing one client (and so its
//! connections, the leader/follower polling and the callers' mailboxes). The tests fail if a
//! change adds allocations to the steady state of `try_lock` + `release` over five real
//! redis-servers; they print the figures they measured.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use redlock_mux::Client;

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

fn note_allocation() {
    // `try_with`: the slot may already be gone while a thread exits.
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
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

const CYCLES: u64 = 1000;

/// Allocations in all `CYCLES` steady-state acquire+release cycles, at most. Measured: 0 to 2,
/// none of them per cycle: a buffer or queue that grows once to a new high-water mark (a reply
/// owed by a slow node, a longer pipeline). A cost per cycle would show as 1000 or more.
const MAX_TOTAL: u64 = 10;

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
    let ttl = Duration::from_secs(10);
    let cycle = || {
        let lock = client.try_lock("alloc:key", ttl).unwrap();
        lock.release().unwrap();
    };
    // Warm-up: connections, script loads, buffers grown to size.
    for _ in 0..200 {
        cycle();
    }
    let total = allocations(|| {
        for _ in 0..CYCLES {
            cycle();
        }
    });
    let per_cycle = total as f64 / CYCLES as f64;
    println!("steady state: {total} allocations in {CYCLES} acquire+release cycles at N=5 ({per_cycle:.2} per cycle)");
    assert!(
        total <= MAX_TOTAL,
        "{total} allocations in {CYCLES} acquire+release cycles ({per_cycle:.2} per cycle)"
    );
    for addr in cluster.addrs() {
        assert_settles_eq!(dbsize(addr), 0, "the lock was left on {addr}");
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
    for addr in cluster.addrs() {
        assert_eq!(dbsize(addr), 0, "the lock was left on {addr}");
    }
}
