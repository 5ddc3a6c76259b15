//! What a client's locks have been doing: counters and latencies, in plain structs.

use std::time::Duration;

use redlock::{NodeStats, RoundStats};

use crate::args::{arg_ref, Out};
use crate::client::redlock_mux_client;
use crate::error::{boundary, redlock_mux_result, Failure};

/// How the acquisition rounds of one lock kind ended.
#[repr(C)]
pub struct redlock_mux_round_stats {
    /// Won on a quorum within the validity.
    pub won: u64,
    /// Lost because the lock was held elsewhere.
    pub contended: u64,
    /// Lost for any other reason (too many nodes failed, the validity ran out, misconfigured
    /// nodes).
    pub unreachable: u64,
}

/// What a client's locks have been doing since it was built: `redlock_mux_client_stats`.
#[repr(C)]
pub struct redlock_mux_stats {
    /// Acquisition rounds of mutexes.
    pub mutex: redlock_mux_round_stats,
    /// Acquisition rounds of read locks.
    pub read: redlock_mux_round_stats,
    /// Acquisition rounds of write locks.
    pub write: redlock_mux_round_stats,
    /// Acquisition rounds of all-or-none locks.
    pub all: redlock_mux_round_stats,
    /// Acquisition rounds of fenced mutexes.
    pub fenced_mutex: redlock_mux_round_stats,
    /// Acquisition rounds of fenced write locks.
    pub fenced_write: redlock_mux_round_stats,
    /// Acquisition rounds of semaphore permits.
    pub semaphore: redlock_mux_round_stats,
    /// Release announcements that woke a waiter for a retry.
    pub wakeups: u64,
    /// Attempts after an acquisition's first.
    pub retries: u64,
    /// Acquisitions that ended with `REDLOCK_MUX_CANCELLED`.
    pub cancellations: u64,
    /// How many nodes the client has: `redlock_mux_client_node_stats` takes 0 to
    /// `node_count - 1`.
    pub node_count: usize,
}

/// One node's failures and reply latency: `redlock_mux_client_node_stats`.
#[repr(C)]
pub struct redlock_mux_node_stats {
    /// Failures in rounds (acquire, extend, release): no reply within the node timeout.
    pub timeout_failures: u64,
    /// ... the connection could not be made.
    pub connect_failures: u64,
    /// ... the node failed recently and was skipped during its reconnect backoff.
    pub backoff_failures: u64,
    /// ... the connection broke.
    pub io_failures: u64,
    /// ... the node sent bytes that are not valid RESP2.
    pub protocol_failures: u64,
    /// ... an error reply from the server.
    pub server_failures: u64,
    /// ... a well-formed reply that was not one of the expected ones.
    pub unexpected_reply_failures: u64,
    /// ... the node refused the connection setup (AUTH, SELECT).
    pub setup_failures: u64,
    /// How many of the node's latest replies the percentiles are taken over (at most 128);
    /// 0 before any reply, and then both percentiles are 0.
    pub latency_samples: u64,
    /// The median time from a round's start to this node's reply, in microseconds.
    pub latency_p50_us: u64,
    /// The 99th percentile of the same, in microseconds.
    pub latency_p99_us: u64,
}

fn round_stats(r: &RoundStats) -> redlock_mux_round_stats {
    redlock_mux_round_stats {
        won: r.won,
        contended: r.contended,
        unreachable: r.unreachable,
    }
}

/// Writes to `*out` what the client's locks have been doing since it was built (shared with
/// every lock taken through it): acquisition rounds won, contended and unreachable per lock
/// kind, wake-ups, retries and cancellations, and how many nodes `redlock_mux_client_node_stats`
/// can tell of. Each counter is exact; counters read while other threads lock are not all of
/// one instant.
///
/// # Safety
/// `client` is NULL or a live client; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_stats(
    client: *const redlock_mux_client,
    out: *mut redlock_mux_stats,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(client, "client")?, Out::new(out, "out")?) };
        let s = handle.client.stats();
        out.write(redlock_mux_stats {
            mutex: round_stats(&s.kinds.mutex),
            read: round_stats(&s.kinds.read),
            write: round_stats(&s.kinds.write),
            all: round_stats(&s.kinds.all),
            fenced_mutex: round_stats(&s.kinds.fenced_mutex),
            fenced_write: round_stats(&s.kinds.fenced_write),
            semaphore: round_stats(&s.kinds.semaphore),
            wakeups: s.wakeups,
            retries: s.retries,
            cancellations: s.cancellations,
            node_count: s.nodes.len(),
        });
        Ok(())
    })
}

/// Writes to `*out` the failures and reply latency of node `node` (0 to `node_count - 1`, in
/// the order the nodes were added). `REDLOCK_MUX_INVALID_ARGUMENT` for a node the client does
/// not have.
///
/// # Safety
/// `client` is NULL or a live client; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_node_stats(
    client: *const redlock_mux_client,
    node: usize,
    out: *mut redlock_mux_node_stats,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(client, "client")?, Out::new(out, "out")?) };
        let nodes = handle.client.stats().nodes;
        let n: &NodeStats = nodes.get(node).ok_or_else(|| {
            Failure::invalid(format!(
                "node {node} is not one of the client's {} nodes",
                nodes.len()
            ))
        })?;
        let micros = |d: Option<Duration>| d.map_or(0, |d| d.as_micros() as u64);
        let f = &n.failures;
        out.write(redlock_mux_node_stats {
            timeout_failures: f.timeout,
            connect_failures: f.connect,
            backoff_failures: f.backoff,
            io_failures: f.io,
            protocol_failures: f.protocol,
            server_failures: f.server,
            unexpected_reply_failures: f.unexpected_reply,
            setup_failures: f.setup,
            latency_samples: n.latency_samples as u64,
            latency_p50_us: micros(n.latency_p50),
            latency_p99_us: micros(n.latency_p99),
        });
        Ok(())
    })
}
