//! The lock `run` holds: every use `run` makes of the library is here (the client, the four
//! lock kinds, keep-alive, and what their errors mean as exit statuses).

use std::ffi::OsString;
use std::time::Duration;

use redlock_mux::{Client, Error, KeepAlive, KeepAliveError, KeptLock};

use crate::args::EXIT_USAGE;
use crate::Fail;

/// Exit status when the lock was not acquired within the wait (sysexits `EX_TEMPFAIL`); `-E`
/// changes it.
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit status when the lock was lost while the command ran.
pub const EXIT_LOST: i32 = 76;
/// Exit status when a node refused the connection setup: a wrong password or user, a
/// database the server does not have, or an address that is not a Redis server's (sysexits
/// `EX_CONFIG`). It comes at once, without waiting out the wait.
pub const EXIT_CONFIG: i32 = 78;

/// How long the client waits for one node's reply (the library's default, set here because
/// [`MIN_TTL`] depends on it).
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// How soon the keeper retries an extension that failed (the library's default).
const KEEP_RETRY: Duration = Duration::from_millis(100);
/// The shortest TTL `run` keeps alive. The keeper extends every third of the TTL and must
/// have room, before the lock runs out, for an extension round that times out on a node and
/// for a retry: so a third of the TTL must be at least two node timeouts and a retry delay.
pub const MIN_TTL: Duration = Duration::from_millis(3 * (2 * 50 + 100));
const _: () =
    assert!(MIN_TTL.as_millis() == 3 * (2 * NODE_TIMEOUT.as_millis() + KEEP_RETRY.as_millis()));

/// Which lock `run` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The mutex.
    Mutex,
    /// The shared side of the read-write lock.
    Read,
    /// The exclusive side of the read-write lock.
    Write,
    /// One permit of the semaphore of this many permits.
    Permit(u32),
}

/// What `run` asks for.
#[derive(Debug, Clone)]
pub struct Request {
    /// Node URLs.
    pub nodes: Vec<String>,
    /// The key.
    pub key: String,
    /// Which lock.
    pub kind: Kind,
    /// The TTL, kept alive.
    pub ttl: Duration,
    /// How long to wait; zero makes a single attempt.
    pub wait: Duration,
    /// First come, first served.
    pub fair: bool,
    /// The exit status when the lock is not acquired.
    pub conflict_code: i32,
    /// The TLS files of `rediss://` nodes.
    pub tls: crate::args::TlsFiles,
}

/// A lock held and kept alive.
pub struct Held {
    kept: KeptLock,
    key: String,
    fence: Option<u64>,
}

impl Held {
    /// The variables the command gets: `REDLOCK_MUX_KEY`, `REDLOCK_MUX_TOKEN`, and
    /// `REDLOCK_MUX_FENCE` for a lock with a fencing token (none of `run`'s kinds has one
    /// today; the variable is then not set).
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        use std::os::unix::ffi::OsStringExt;
        let mut vars = vec![
            ("REDLOCK_MUX_KEY", OsString::from(&self.key)),
            (
                "REDLOCK_MUX_TOKEN",
                OsString::from_vec(self.kept.token().to_vec()),
            ),
        ];
        if let Some(fence) = self.fence {
            vars.push(("REDLOCK_MUX_FENCE", OsString::from(fence.to_string())));
        }
        vars
    }

    /// Whether the lock was lost (its validity ended without an extension).
    pub fn is_lost(&self) -> bool {
        self.kept.is_lost()
    }

    /// Releases the lock; a failure is only reported, as the lock expires by itself.
    pub fn release(self) {
        if let Err(e) = self.kept.release() {
            eprintln!(
                "redlock-mux: releasing {:?} failed (it expires by itself): {e}",
                self.key
            );
        }
    }
}

/// Checks what can be checked before connecting: a TTL the keeper can keep.
pub fn check(request: &Request) -> Result<(), Fail> {
    if request.ttl < MIN_TTL {
        return Err(Fail {
            code: EXIT_USAGE,
            message: format!(
                "--ttl {:?} is too short to be kept alive: it must be at least {:?}, so that a \
                 third of it (the extension interval) leaves room for an extension that times \
                 out and a retry\n(see --help)",
                request.ttl, MIN_TTL
            ),
        });
    }
    Ok(())
}

/// Connects, acquires the lock and hands it to the library's keeper; `on_lost` is called
/// (on the keeper's thread) with the reason if the lock is lost later.
pub fn acquire(
    request: &Request,
    on_lost: impl FnOnce(String) + Send + 'static,
) -> Result<Held, Fail> {
    check(request)?;
    let client = request
        .tls
        .apply(Client::builder())
        .nodes(&request.nodes)
        .node_timeout(NODE_TIMEOUT)
        .wait_timeout(request.wait)
        .retry_count(u32::MAX)
        .fair(request.fair)
        .build()
        .map_err(|e| setup_failure(&e))?;
    let keep = || {
        KeepAlive::new(request.ttl)
            .retry(KEEP_RETRY)
            .on_lost(move |lost| on_lost(lost.error.to_string()))
    };
    let (key, ttl, once) = (&request.key, request.ttl, request.wait.is_zero());
    let kept = match request.kind {
        Kind::Mutex => {
            let lock = if once {
                client.try_lock(key, ttl)
            } else {
                client.lock(key, ttl)
            };
            lock.map_err(|e| not_acquired(request, &e))?
                .keep_alive(keep())
                .map_err(refused)?
        }
        Kind::Read => {
            let lock = if once {
                client.try_read_lock(key, ttl)
            } else {
                client.read_lock(key, ttl)
            };
            lock.map_err(|e| not_acquired(request, &e))?
                .keep_alive(keep())
                .map_err(refused)?
        }
        Kind::Write => {
            let lock = if once {
                client.try_write_lock(key, ttl)
            } else {
                client.write_lock(key, ttl)
            };
            lock.map_err(|e| not_acquired(request, &e))?
                .keep_alive(keep())
                .map_err(refused)?
        }
        Kind::Permit(permits) => {
            let sem = client
                .semaphore(key, permits)
                .map_err(|e| not_acquired(request, &e))?;
            let permit = if once {
                sem.try_acquire(ttl)
            } else {
                sem.acquire(ttl)
            };
            permit
                .map_err(|e| not_acquired(request, &e))?
                .keep_alive(keep())
                .map_err(refused)?
        }
    };
    Ok(Held {
        kept,
        key: request.key.clone(),
        fence: None,
    })
}

/// A failed `build`: a misconfigured node (78) or a bad argument, such as a node URL (64).
fn setup_failure(e: &Error) -> Fail {
    match e {
        Error::Config { .. } => Fail {
            code: EXIT_CONFIG,
            message: e.to_string(),
        },
        Error::InvalidArgument(_) => Fail {
            code: EXIT_USAGE,
            message: format!("{e}\n(see --help)"),
        },
        _ => Fail::other(e.to_string()),
    }
}

/// A failed acquisition: a bad argument (64), a misconfigured node (78), or not acquired in
/// time (75, or `-E`).
fn not_acquired(request: &Request, e: &Error) -> Fail {
    let key = &request.key;
    match e {
        Error::InvalidArgument(_) => Fail {
            code: EXIT_USAGE,
            message: format!("{e}\n(see --help)"),
        },
        Error::Config { .. } => Fail {
            code: EXIT_CONFIG,
            message: format!("lock {key:?} not acquired: {e}"),
        },
        _ if request.wait.is_zero() => Fail {
            code: request.conflict_code,
            message: format!("lock {key:?} not acquired: {e}"),
        },
        _ => Fail {
            code: request.conflict_code,
            message: format!("lock {key:?} not acquired within {:?}: {e}", request.wait),
        },
    }
}

/// Settings the keeper refused: the guard comes back, and is released before reporting.
fn refused<G: Releasable>(refused: KeepAliveError<G>) -> Fail {
    let message = format!("{}\n(see --help)", refused.error);
    refused.guard.release_now();
    Fail {
        code: EXIT_USAGE,
        message,
    }
}

/// A guard given back by `keep_alive`.
trait Releasable {
    fn release_now(self);
}

impl Releasable for redlock_mux::Lock {
    fn release_now(self) {
        let _ = self.release();
    }
}

impl Releasable for redlock_mux::ReadLock {
    fn release_now(self) {
        let _ = self.release();
    }
}

impl Releasable for redlock_mux::Permit {
    fn release_now(self) {
        let _ = self.release();
    }
}

impl Releasable for redlock_mux::WriteLock {
    fn release_now(self) {
        let _ = self.release();
    }
}
