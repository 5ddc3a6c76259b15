//! The client builder and the client.

use std::ffi::c_char;

use redlock::{Client, ClientBuilder, RwPolicy};

use crate::args::{arg_key, arg_mut, arg_ref, arg_str, free_handle, into_handle, millis, Out};
use crate::error::{boundary, boundary_void, redlock_mux_result, Failure};

/// Builds a `redlock_mux_client`: node URLs and options. Made by
/// `redlock_mux_client_builder_new`, freed by `redlock_mux_client_builder_free`.
///
/// A setter that fails (a NULL argument, a URL that is not UTF-8, an unknown policy) leaves the
/// builder exactly as it was: the nodes and settings given before are kept. The values of
/// options (a zero timeout, a drift factor out of range, a malformed URL) are checked by
/// `redlock_mux_client_builder_build`, which also leaves the builder as it was: set a good
/// value in place of the bad one and build again.
pub struct redlock_mux_client_builder {
    builder: ClientBuilder,
}

/// A Redlock client over N Redis masters. Made by `redlock_mux_client_builder_build`, freed by
/// `redlock_mux_client_free`. Safe to use from many threads at once.
pub struct redlock_mux_client {
    pub(crate) client: Client,
}

/// `redlock_mux_client_builder_set_rw_policy`: new readers get in whenever no writer holds the
/// lock (the default). A stream of overlapping readers can keep a writer out.
pub const REDLOCK_MUX_RW_READ_PREFERRING: u32 = 0;
/// `redlock_mux_client_builder_set_rw_policy`: a waiting writer keeps new readers out, so the
/// readers in place drain and the writer gets in within one reader hold.
pub const REDLOCK_MUX_RW_WRITE_PREFERRING: u32 = 1;

/// Makes a client builder with default settings and no nodes, and writes it to `*out`. Free it
/// with `redlock_mux_client_builder_free`; building does not consume it.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_new(
    out: *mut *mut redlock_mux_client_builder,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let out = unsafe { Out::new(out, "out") }?;
        out.write(into_handle(redlock_mux_client_builder {
            builder: Client::builder(),
        }));
        Ok(())
    })
}

/// Frees a builder. NULL is a no-op.
///
/// # Safety
/// `builder` is NULL or a builder not yet freed.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_free(builder: *mut redlock_mux_client_builder) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(builder) })
}

/// The body of every setter: changes a builder through the Rust builder's by-value setters,
/// all or nothing. `f` works on a copy, which replaces the builder only once `f` has
/// succeeded, so a setter that fails (or panics) leaves the builder exactly as it was, as the
/// header promises.
///
/// A new setter is one call of this: inside `f`, check and convert its arguments (with the
/// helpers of `args`: `arg_str` for text, `arg_bytes` for bytes), then call the Rust setter.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread; what `f` reads, as its
/// caller promises.
unsafe fn update(
    builder: *mut redlock_mux_client_builder,
    f: impl FnOnce(ClientBuilder) -> Result<ClientBuilder, Failure>,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { arg_mut(builder, "builder") }?;
        handle.builder = f(handle.builder.clone())?;
        Ok(())
    })
}

/// Adds one node, as `redis://[user:password@]host[:port][/db]`, bare `host:port`,
/// `rediss://...` (TLS, when the library has it: see `redlock_mux_has_tls`), or a Unix socket,
/// `unix:///path/to/redis.sock[?db=N&user=U&pass=P]` (or `redis+unix://`), or a Redis
/// Cluster as one node, `redis+cluster://[user:password@]host:port[,host:port...][?wait=N&waitaof=L,R]`
/// (its seeds; `rediss+cluster://` with TLS), or a master managed by Redis Sentinel as one
/// node, `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[?db=N&wait=N&waitaof=L,R&sentinel_user=U&sentinel_password=P]`
/// (its sentinels; `rediss+sentinel://` with TLS), given as `url_len` bytes of UTF-8 (no
/// terminating NUL needed). Every form takes `?wait=N` (a grant, or a release, counts once
/// `WAIT N` says N replicas have it) and `?waitaof=L,R` (`L` 0 or 1, `R` 0 to 16, not both 0:
/// once `WAITAOF L R` says the master's append-only file, and R replicas', have it). The URL is checked and resolved by
/// `redlock_mux_client_builder_build`. The quorum is N / 2 + 1 of the nodes added.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread; `url` is NULL or points to
/// `url_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_add_node(
    builder: *mut redlock_mux_client_builder,
    url: *const c_char,
    url_len: usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        update(builder, |b| {
            let url = arg_str(url.cast::<u8>(), url_len, "url", "the node URL")?;
            Ok(b.nodes([url]))
        })
    }
}

/// How long to wait for one node's reply before counting it as failed, in milliseconds. Keep it
/// small next to the TTL. Default 50. Zero is rejected by `redlock_mux_client_builder_build`.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_node_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.node_timeout(millis(ms)))) }
}

/// How long a connect may take (with its TLS handshake), in milliseconds. Default 1000. Zero is rejected by
/// `redlock_mux_client_builder_build`.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_connect_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.connect_timeout(millis(ms)))) }
}

/// Trusts the CA certificates of a PEM file for `rediss://` nodes, besides the system's roots;
/// may be called more than once. The path is `path_len` bytes of UTF-8 (no terminating NUL
/// needed); the file is read by `redlock_mux_client_builder_build`, which fails with
/// `REDLOCK_MUX_INVALID_ARGUMENT` when it cannot be read or holds no certificate, and also
/// when the library was built without TLS (see `redlock_mux_has_tls`).
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread; `path` is NULL or points to
/// `path_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_add_tls_ca_file(
    builder: *mut redlock_mux_client_builder,
    path: *const c_char,
    path_len: usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        update(builder, |b| {
            let path = arg_str(path.cast::<u8>(), path_len, "path", "the CA file's path")?;
            Ok(b.tls_ca_file(path))
        })
    }
}

/// Shows a client certificate to `rediss://` nodes that ask for one (mutual TLS): the PEM
/// file of its chain, `cert_len` bytes of UTF-8, and that of its private key, `key_len` bytes.
/// Read by `redlock_mux_client_builder_build`, as for
/// `redlock_mux_client_builder_add_tls_ca_file`.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread; `cert` and `key` are NULL or
/// point to `cert_len` and `key_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_tls_client_cert(
    builder: *mut redlock_mux_client_builder,
    cert: *const c_char,
    cert_len: usize,
    key: *const c_char,
    key_len: usize,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promises.
    unsafe {
        update(builder, |b| {
            let cert = arg_str(
                cert.cast::<u8>(),
                cert_len,
                "cert",
                "the certificate's path",
            )?;
            let key = arg_str(key.cast::<u8>(), key_len, "key", "the key's path")?;
            Ok(b.tls_client_cert(cert, key))
        })
    }
}

/// How many times a waiting acquisition may retry on its own: after a retry delay in which no
/// release was announced. Retries that a release announcement prompts are not counted; the
/// wait timeout bounds them. 0 makes a single attempt. Default `UINT32_MAX`, which means no
/// limit: the wait timeout alone bounds the wait.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_retry_count(
    builder: *mut redlock_mux_client_builder,
    count: u32,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.retry_count(count))) }
}

/// The base delay between the attempts of a waiting acquisition when no release is announced,
/// in milliseconds: a waiter retries at once when one is. Each delay is drawn from
/// [d/2, 3d/2). Default 50.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_retry_delay_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.retry_delay(millis(ms)))) }
}

/// The longest a waiting acquisition waits in all, in milliseconds, whatever the retry count;
/// with the default retry count, this alone bounds the wait. Default 10000.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_wait_timeout_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.wait_timeout(millis(ms)))) }
}

/// Clock drift between processes allowed for, as a fraction of the TTL; 2 ms are always added.
/// Must be in [0, 0.5), which `redlock_mux_client_builder_build` checks. Default 0.01.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_drift_factor(
    builder: *mut redlock_mux_client_builder,
    factor: f64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.drift_factor(factor))) }
}

/// Serves waiters in arrival order when `fair` is non-zero: under contention, waiters queue on
/// every node and only the head of the queue may take the lock, so nobody starves. Default 0
/// (off).
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_fair(
    builder: *mut redlock_mux_client_builder,
    fair: u8,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.fair(fair != 0))) }
}

/// With fairness on: an acquirer joins an empty queue once it has waited this many
/// milliseconds (it always joins a non-empty one). Default 0: join at the first retry.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_fair_after_ms(
    builder: *mut redlock_mux_client_builder,
    ms: u64,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe { update(builder, |b| Ok(b.fair_after(millis(ms)))) }
}

/// Whom read-write locks favour when readers hold a lock and a writer waits:
/// `REDLOCK_MUX_RW_READ_PREFERRING` (the default) or `REDLOCK_MUX_RW_WRITE_PREFERRING`. Any
/// other value gives `REDLOCK_MUX_INVALID_ARGUMENT` and leaves the builder as it was.
///
/// # Safety
/// `builder` is NULL or a live builder used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_set_rw_policy(
    builder: *mut redlock_mux_client_builder,
    policy: u32,
) -> redlock_mux_result {
    // SAFETY: forwarded caller promise.
    unsafe {
        update(builder, |b| match policy {
            REDLOCK_MUX_RW_READ_PREFERRING => Ok(b.rw_policy(RwPolicy::ReadPreferring)),
            REDLOCK_MUX_RW_WRITE_PREFERRING => Ok(b.rw_policy(RwPolicy::WritePreferring)),
            _ => Err(Failure::invalid("unknown read-write policy")),
        })
    }
}

/// Checks every setting, resolves every node, connects to every node (waiting at most the
/// connect timeout), and writes a new client to `*out`. A node that is down does not make this
/// fail; a node that refuses the connection setup (a wrong password, a database it does not
/// have) gives `REDLOCK_MUX_CONFIG` at once. The builder is left as it was and must still be
/// freed. Free the client with `redlock_mux_client_free`.
///
/// # Safety
/// `builder` is NULL or a live builder not being changed by another thread; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_builder_build(
    builder: *const redlock_mux_client_builder,
    out: *mut *mut redlock_mux_client,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe { (arg_ref(builder, "builder")?, Out::new(out, "out")?) };
        let client = handle.builder.clone().build()?;
        out.write(into_handle(redlock_mux_client { client }));
        Ok(())
    })
}

/// Waits until every node has answered what the client sent it (releases above all, those
/// sent again after a connection broke too), and says whether they all arrived: 10 s at most,
/// and it gives up sooner on nodes that make no progress for 2 s (down, or paused). Then
/// `REDLOCK_MUX_UNDELIVERED`, naming those nodes: what the releases were to delete stays there
/// until its TTL runs out. The client stays usable; free it as usual.
///
/// # Safety
/// `client` is NULL or a live client.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_close(
    client: *const redlock_mux_client,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promise.
        let handle = unsafe { arg_ref(client, "client")? };
        handle.client.clone().close()?;
        Ok(())
    })
}

/// Frees a client. NULL is a no-op. Locks taken through it stay usable. Freeing the last
/// handle (the client, or the last lock taken through it) waits as
/// `redlock_mux_client_close` does, so that a release that returned at its quorum still
/// reaches the slower nodes, but cannot say whether it did.
///
/// A client may be used on both sides of a `fork()`: a child opens connections of its own at
/// its first use of the client, and never touches its parent's, nor waits on anything a thread
/// of its parent held at the fork. A child freeing its copy of the client (or of a lock its
/// parent took, see `redlock_mux_lock_free`) leaves the parent's connections and locks as they
/// were.
///
/// # Safety
/// `client` is NULL or a client not yet freed, which no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_free(client: *mut redlock_mux_client) {
    // SAFETY: forwarded caller promise.
    boundary_void(|| unsafe { free_handle(client) })
}

/// Writes to `*out_quorum` how many nodes must admit a holder of a semaphore of `permits`
/// permits over this client's N nodes. Each node admits `c` holders, the fewest that let
/// `permits` holders in (`permits * quorum <= c * N`) while keeping `permits + 1` out
/// (`(permits + 1) * quorum > c * N`), and the quorum is the smallest with that `c` (the
/// Redlock majority for 1 permit; 2 of 5 nodes for 2 permits, with `c = 1`). Acquires stop
/// once more than `N - quorum` nodes are down. `REDLOCK_MUX_INVALID_ARGUMENT`
/// for 0 permits or more than the library allows.
///
/// # Safety
/// `client` is NULL or a live client; `out_quorum` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_semaphore_quorum(
    client: *const redlock_mux_client,
    permits: u32,
    out_quorum: *mut usize,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, out) = unsafe {
            (
                arg_ref(client, "client")?,
                Out::new(out_quorum, "out_quorum")?,
            )
        };
        out.write(handle.client.semaphore("q", permits)?.quorum());
        Ok(())
    })
}

/// Writes to `*out_available` an estimate of the free permits of the semaphore of `permits`
/// permits on the `key_len` bytes at `key`, for monitoring: how many acquisitions would win
/// one after the other if nothing else changed (a node that does not answer counts as full).
///
/// # Safety
/// `client` is NULL or a live client; `key` is NULL or points to `key_len` readable bytes;
/// `out_available` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn redlock_mux_client_semaphore_available(
    client: *const redlock_mux_client,
    key: *const u8,
    key_len: usize,
    permits: u32,
    out_available: *mut u32,
) -> redlock_mux_result {
    boundary(|| {
        // SAFETY: forwarded caller promises.
        let (handle, key, out) = unsafe {
            (
                arg_ref(client, "client")?,
                arg_key(key, key_len, "key")?,
                Out::new(out_available, "out_available")?,
            )
        };
        out.write(handle.client.semaphore(key, permits)?.available()?);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{REDLOCK_MUX_INVALID_ARGUMENT, REDLOCK_MUX_PANIC};

    #[test]
    fn a_setter_that_fails_or_panics_leaves_the_builder_as_it_was() {
        let b = into_handle(redlock_mux_client_builder {
            builder: Client::builder().nodes(["127.0.0.1:7"]).retry_count(5),
        });
        // SAFETY: `b` is a live builder, used by this thread only, until it is freed below.
        unsafe {
            let before = format!("{:?}", (*b).builder);
            let failed = update(b, |builder| {
                let _ = builder.retry_count(9);
                Err(Failure::invalid("refused"))
            });
            assert_eq!(failed, REDLOCK_MUX_INVALID_ARGUMENT);
            assert_eq!(format!("{:?}", (*b).builder), before);
            let panicked = update(b, |builder| {
                let _ = builder.retry_count(9);
                panic!("deliberate panic in a setter")
            });
            assert_eq!(panicked, REDLOCK_MUX_PANIC);
            assert_eq!(format!("{:?}", (*b).builder), before);
            assert_eq!(
                redlock_mux_client_builder_set_rw_policy(b, 7),
                REDLOCK_MUX_INVALID_ARGUMENT
            );
            assert_eq!(format!("{:?}", (*b).builder), before);
            redlock_mux_client_builder_free(b);
        }
    }
}
