//! The one public error type, and what it says about each node.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::time::Duration;

use crate::resp::{DecodeError, ServerErrorKind};

/// Everything that can go wrong with a lock operation.
///
/// The variants say what happened and, where nodes are involved, on which nodes. Match on the
/// kind you care about and treat the rest as a failure; the enum is `#[non_exhaustive]` so new
/// kinds can be added without breaking you.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument was rejected before anything was sent to any node.
    InvalidArgument(InvalidArgument),
    /// The lock is held by someone else: too many nodes said no for a quorum to be reached.
    Contended {
        /// How many nodes refused because another token holds the key.
        refused: usize,
        /// How many nodes the client talks to.
        nodes: usize,
        /// The nodes that failed instead of answering (they count against the quorum too).
        failures: Vec<NodeFailure>,
    },
    /// Too many nodes failed (down, timed out, erroring) for a quorum to be reached at all.
    QuorumUnreachable {
        /// Nodes needed: `nodes / 2 + 1`.
        quorum: usize,
        /// How many nodes the client talks to.
        nodes: usize,
        /// What happened on each failed node.
        failures: Vec<NodeFailure>,
    },
    /// The validity ran out: the quorum answered later than the TTL allows (after subtracting the
    /// clock-drift allowance), or an extend was asked for after the lock's validity had ended.
    ValidityExpired {
        /// How long the attempt took from the first send to the decision.
        elapsed: Duration,
    },
    /// The local system refused a resource the client needs (a poller or a socket), for
    /// example because the process is out of file descriptors.
    Io(io::ErrorKind),
    /// A node refused the setup of a connection, or answered it as no Redis server does: a
    /// node URL (user, password, database) or a server's configuration is wrong, or the
    /// address is not a Redis server's. Waiting does not fix that, so this is returned at once
    /// and never retried.
    ///
    /// [`ClientBuilder::build`](crate::ClientBuilder::build) returns it when any node's setup
    /// fails. A lock call returns it when its round was not won and too few nodes are left
    /// for a quorum once the misconfigured ones are counted out; while a quorum is still
    /// possible without them, their failures are only listed with the round's other ones.
    ///
    /// Nothing but the setup commands is ever sent on a connection before its setup replies
    /// are read and checked, so a failed setup writes nothing.
    Config {
        /// The nodes whose setup failed, each with a [`NodeErrorKind::Setup`].
        failures: Vec<NodeFailure>,
    },
    /// A waiting acquisition ([`Client::lock`](crate::Client::lock) and the other calls
    /// without `try_`) ended without the lock: `deadline` came before any attempt won. That is
    /// the [wait timeout](crate::ClientBuilder::wait_timeout) or the
    /// [retry count](crate::ClientBuilder::retry_count). `last` is why the last attempt was
    /// lost: most often [`Error::Contended`], and then [`is_contended`](Error::is_contended)
    /// is true of this error too.
    ///
    /// A `try_` call makes one attempt and returns its error as it is; so does a waiting call
    /// that stops for a reason waiting cannot cure ([`Error::Config`], [`Error::Io`]).
    WaitEnded {
        /// [`Deadline::WaitTimeout`] or [`Deadline::RetryCount`].
        deadline: Deadline,
        /// The error of the last attempt.
        last: Box<Error>,
    },
    /// A waiting acquisition was cancelled through its [`Cancel`](crate::Cancel) handle
    /// before it got the lock. What it had on the nodes was undone.
    Cancelled,
    /// [`Client::close`](crate::Client::close) gave up before every release (or cleanup) the
    /// client sent had reached these nodes: they stopped answering, or could not be reached
    /// again. What those releases were to delete stays there until its TTL runs out.
    Undelivered {
        /// The nodes still owed releases, each with why they were given up.
        failures: Vec<NodeFailure>,
    },
    /// The lock was taken by another process: this is a copy of it that a child inherited
    /// through `fork()`. Only the process that took a lock may release, extend, downgrade or
    /// keep it alive; nothing was sent to any node. The lock stays its holder's, and dropping
    /// the copy does nothing.
    OtherProcess {
        /// The process that took the lock, and holds it.
        holder: u32,
    },
}

/// A deadline that ended a lock operation; see [`Error::deadline`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deadline {
    /// The [wait timeout](crate::ClientBuilder::wait_timeout): no attempt starts after it.
    WaitTimeout,
    /// The [retry count](crate::ClientBuilder::retry_count): that many retries came after a
    /// retry delay in which no release was announced.
    RetryCount,
    /// The lock's validity: the quorum answered later than the TTL allows, or an extend was
    /// asked for after the validity had ended ([`Error::ValidityExpired`]).
    Validity,
    /// The per-node timeout: the nodes that had not answered were counted as failed (their
    /// failures are [`NodeErrorKind::Timeout`]), which decided the round.
    NodeTimeout,
}

impl fmt::Display for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Deadline::WaitTimeout => "the wait timeout",
            Deadline::RetryCount => "the retry count",
            Deadline::Validity => "the lock's validity",
            Deadline::NodeTimeout => "the per-node timeout",
        })
    }
}

impl Error {
    /// True when the lock was held by someone else, so waiting and retrying makes sense: a
    /// [`Contended`](Error::Contended) error, or a wait that [ended](Error::WaitEnded) on one.
    pub fn is_contended(&self) -> bool {
        match self {
            Error::Contended { .. } => true,
            Error::WaitEnded { last, .. } => last.is_contended(),
            _ => false,
        }
    }

    /// True for [`Error::Config`]: a node URL or a server's configuration is wrong, and
    /// retrying cannot help.
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config { .. })
    }

    /// The node failures this error carries, if any (for an ended wait, its last attempt's).
    pub fn failures(&self) -> &[NodeFailure] {
        match self {
            Error::Contended { failures, .. }
            | Error::QuorumUnreachable { failures, .. }
            | Error::Config { failures }
            | Error::Undelivered { failures } => failures,
            Error::WaitEnded { last, .. } => last.failures(),
            _ => &[],
        }
    }

    /// Which deadline ended the operation, if one did: the wait timeout or the retry count for
    /// a [wait that ended](Error::WaitEnded), the lock's validity for
    /// [`ValidityExpired`](Error::ValidityExpired), and the per-node timeout for a round that
    /// was lost because nodes did not answer in time. `None` when the nodes decided (they
    /// refused or failed) before any deadline, or for errors that are not about time.
    pub fn deadline(&self) -> Option<Deadline> {
        match self {
            Error::WaitEnded { deadline, .. } => Some(*deadline),
            Error::ValidityExpired { .. } => Some(Deadline::Validity),
            Error::Contended { failures, .. } | Error::QuorumUnreachable { failures, .. }
                if failures
                    .iter()
                    .any(|f| matches!(f.kind, NodeErrorKind::Timeout)) =>
            {
                Some(Deadline::NodeTimeout)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(a) => write!(f, "invalid argument: {a}"),
            Error::Contended {
                refused,
                nodes,
                failures,
            } => {
                write!(
                    f,
                    "lock is held elsewhere: {refused} of {nodes} nodes refused"
                )?;
                write_failures(f, failures)
            }
            Error::QuorumUnreachable {
                quorum,
                nodes,
                failures,
            } => {
                write!(
                    f,
                    "quorum of {quorum} out of {nodes} nodes unreachable: {} failed",
                    failures.len()
                )?;
                write_failures(f, failures)
            }
            Error::ValidityExpired { elapsed } => write!(
                f,
                "lock validity ran out (the attempt took {} ms)",
                elapsed.as_millis()
            ),
            Error::Io(kind) => write!(f, "local I/O resource unavailable: {kind}"),
            Error::Config { failures } => {
                write!(
                    f,
                    "node configuration error: the setup of {} of the connections failed, check the node URLs and the servers",
                    failures.len()
                )?;
                write_failures(f, failures)
            }
            Error::WaitEnded { deadline, last } => {
                write!(f, "gave up waiting at {deadline}: {last}")
            }
            Error::Cancelled => f.write_str("the acquisition was cancelled"),
            Error::Undelivered { failures } => {
                write!(
                    f,
                    "releases not known to have reached {} of the nodes; what they were to \
                     delete stays until its TTL runs out",
                    failures.len()
                )?;
                write_failures(f, failures)
            }
            Error::OtherProcess { holder } => write!(
                f,
                "the lock belongs to process {holder}, which took it: a process it forked may \
                 not release, extend or keep it alive"
            ),
        }
    }
}

fn write_failures(f: &mut fmt::Formatter<'_>, failures: &[NodeFailure]) -> fmt::Result {
    for (i, n) in failures.iter().enumerate() {
        f.write_str(if i == 0 { " (" } else { "; " })?;
        write!(f, "{n}")?;
    }
    if !failures.is_empty() {
        f.write_str(")")?;
    }
    Ok(())
}

impl std::error::Error for Error {}

impl From<InvalidArgument> for Error {
    fn from(a: InvalidArgument) -> Self {
        Error::InvalidArgument(a)
    }
}

/// Why an argument was rejected.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidArgument {
    /// The key is empty.
    EmptyKey,
    /// The key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN).
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The TTL is zero.
    ZeroTtl,
    /// The TTL does not fit Redis's millisecond expiry (or this machine's clock).
    TtlOutOfRange {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The TTL is not longer than the clock-drift allowance, so the lock could never be valid.
    TtlBelowDrift {
        /// The TTL asked for.
        ttl: Duration,
        /// The drift allowance: `ttl * drift_factor + 2 ms`.
        drift: Duration,
    },
    /// No nodes were given.
    NoNodes,
    /// More nodes than [`MAX_NODES`](crate::MAX_NODES).
    TooManyNodes {
        /// How many were given.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// The same server was given twice, possibly with different databases: the two would fail
    /// together, so they cannot count as two nodes of a quorum.
    DuplicateNode {
        /// The second URL naming it, its password hidden (`***`).
        url: String,
    },
    /// A node URL could not be understood or resolved.
    BadUrl {
        /// The URL as given, its password hidden (`***`).
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An all-or-none lock was asked for no keys.
    NoKeys,
    /// A semaphore was asked for no permits (it could never be held), or for more than
    /// `max`.
    BadPermits {
        /// The permits asked for.
        permits: u32,
        /// The cap.
        max: u32,
    },
    /// A semaphore's quorum admits too many holders or cannot be met whatever the holders
    /// each node admits (or is more than the nodes): no `c ≤ permits` has `permits·quorum ≤ c·nodes` (every
    /// permit fits) and `c·nodes < (permits + 1)·quorum` (one more holder does not). See
    /// [`Semaphore`](crate::Semaphore).
    UnsafeQuorum {
        /// The semaphore's permits.
        permits: u32,
        /// How many nodes the client talks to.
        nodes: usize,
        /// The quorum asked for.
        quorum: usize,
        /// The quorum [`Client::semaphore`](crate::Client::semaphore) takes: the smallest
        /// with the fewest holders per node.
        min: usize,
    },
    /// A token given to a `resume_*` call is not one this library makes: 40 lowercase hex
    /// characters.
    BadToken,
    /// An all-or-none lock was given the same key twice.
    DuplicateKey {
        /// The key given more than once.
        key: Vec<u8>,
    },
    /// An all-or-none lock was given more keys than
    /// [`MAX_LOCK_ALL_KEYS`](crate::MAX_LOCK_ALL_KEYS).
    TooManyKeys {
        /// How many were given.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// An all-or-none lock on a client with a Redis Cluster member (`redis+cluster://`) was
    /// given keys that hash to different slots. Each node runs one script over the whole set,
    /// and a cluster runs a script only on keys of one slot: give the keys of a set one hash
    /// tag (`{order:42}:a`, `{order:42}:b`).
    KeysInSeveralSlots {
        /// The set's first key (in sorted order).
        first: Vec<u8>,
        /// A key whose slot is not the first one's.
        other: Vec<u8>,
    },
    /// A builder option is out of range.
    BadOption {
        /// The option's name.
        name: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A TLS file given to the builder ([`tls_ca_file`](crate::ClientBuilder::tls_ca_file),
    /// [`tls_client_cert`](crate::ClientBuilder::tls_client_cert)) cannot be read or used.
    BadTlsFile {
        /// The file, as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A keep-alive interval that cannot keep the lock: zero, or not shorter than the validity
    /// each extension gives (its TTL less the drift allowance), so the lock would lapse
    /// between two extensions.
    KeepAliveInterval {
        /// The interval asked for (a third of the TTL unless set).
        interval: Duration,
        /// The validity each extension gives.
        validity: Duration,
    },
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidArgument::EmptyKey => f.write_str("the key is empty"),
            InvalidArgument::KeyTooLong { len, max } => {
                write!(f, "the key is {len} bytes long, more than the cap of {max}")
            }
            InvalidArgument::ZeroTtl => f.write_str("the TTL is zero"),
            InvalidArgument::TtlOutOfRange { ttl } => {
                write!(f, "the TTL {ttl:?} does not fit a millisecond expiry")
            }
            InvalidArgument::TtlBelowDrift { ttl, drift } => write!(
                f,
                "the TTL {ttl:?} is not longer than the clock-drift allowance {drift:?}"
            ),
            InvalidArgument::NoNodes => f.write_str("no nodes were given"),
            InvalidArgument::TooManyNodes { count, max } => {
                write!(f, "{count} nodes given, more than the cap of {max}")
            }
            InvalidArgument::DuplicateNode { url } => {
                write!(f, "node {url} is given more than once")
            }
            InvalidArgument::BadUrl { url, reason } => write!(f, "bad node URL {url:?}: {reason}"),
            InvalidArgument::NoKeys => f.write_str("no keys were given"),
            InvalidArgument::BadPermits { permits, max } => {
                write!(f, "a semaphore needs 1 to {max} permits, not {permits}")
            }
            InvalidArgument::UnsafeQuorum {
                permits,
                nodes,
                quorum,
                min,
            } => write!(
                f,
                "a quorum of {quorum} of {nodes} nodes would let more than {permits} holders \
                 into a {permits}-permit semaphore, or not all of them, whatever each node \
                 admits; {min} is the smallest that works"
            ),
            InvalidArgument::BadToken => f.write_str("a lock token is 40 lowercase hex characters"),
            InvalidArgument::DuplicateKey { key } => write!(
                f,
                "key {:?} is given more than once",
                String::from_utf8_lossy(key)
            ),
            InvalidArgument::TooManyKeys { count, max } => {
                write!(f, "{count} keys given, more than the cap of {max}")
            }
            InvalidArgument::KeysInSeveralSlots { first, other } => write!(
                f,
                "keys {:?} and {:?} hash to different Redis Cluster slots: an all-or-none lock \
                 on a cluster member takes keys of one slot (give them one hash tag, such as \
                 {{order:42}}:a and {{order:42}}:b)",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(other)
            ),
            InvalidArgument::BadOption { name, reason } => write!(f, "option {name}: {reason}"),
            InvalidArgument::BadTlsFile { path, reason } => {
                write!(f, "TLS file {path:?}: {reason}")
            }
            InvalidArgument::KeepAliveInterval { interval, validity } => write!(
                f,
                "the keep-alive interval {interval:?} must be more than zero and less than the \
                 validity each extension gives, {validity:?}"
            ),
        }
    }
}

impl std::error::Error for InvalidArgument {}

/// What went wrong on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// The node's index in the list given to the client.
    pub node: usize,
    /// The node's address, as `host:port`. When a connect failed and the host is a name, the
    /// addresses it resolved to follow, each of which was tried in turn:
    /// `localhost:6379, tried [::1]:6379, 127.0.0.1:6379`.
    pub addr: String,
    /// What happened.
    pub kind: NodeErrorKind,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): {}", self.node, self.addr, self.kind)
    }
}

/// What went wrong on one node.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeErrorKind {
    /// No reply within the per-node timeout.
    Timeout,
    /// The connection could not be made.
    Connect(io::ErrorKind),
    /// The node failed recently and the client is waiting out its reconnect backoff.
    Backoff,
    /// The connection broke.
    Io(io::ErrorKind),
    /// The node sent bytes that are not valid RESP2; the connection was closed.
    Protocol(DecodeError),
    /// The node answered with an error.
    Server {
        /// The error's kind, from its prefix.
        kind: ServerErrorKind,
        /// The error message as the server sent it.
        message: String,
    },
    /// The node answered with a well-formed reply that this command never returns.
    UnexpectedReply,
    /// The node is the same server (the same `run_id`) as node `node`, reached at another
    /// address: one server would count twice towards the quorum. Reported as the cause of a
    /// [`Setup`](NodeErrorKind::Setup) failure.
    SameServer {
        /// The node it duplicates.
        node: usize,
    },
    /// The node's server turned out to be another version when its connection was set up
    /// again (it was upgraded or downgraded), so the commands written for the server it was
    /// were not sent; the next ones are written for the server it is now.
    ServerChanged,
    /// The node refused the setup of the connection (`AUTH`, `SELECT`), or answered it as no
    /// Redis server does: wrong credentials, a database index the server does not have,
    /// missing permissions, or a server that is not Redis. Nothing else was sent on that
    /// connection. Transient refusals (`LOADING`, `BUSY`, too many clients) are not this
    /// kind; they are [`Server`](NodeErrorKind::Server) failures, retried as usual.
    ///
    /// A node whose [`Semaphore`](crate::Semaphore) on a key was created with another number
    /// of permits fails a semaphore acquire with this kind too (`command` is `semaphore`):
    /// clients that disagree on the permits are misconfigured, and waiting does not fix it.
    Setup {
        /// The setup command that failed: `AUTH`, `SELECT`, `SCRIPT LOAD` or `COMMAND INFO`,
        /// or `TLS` for the TLS handshake (or a TLS port reached without it).
        command: &'static str,
        /// How it failed: a [`Server`](NodeErrorKind::Server) error, a
        /// [`Protocol`](NodeErrorKind::Protocol) error, an
        /// [`UnexpectedReply`](NodeErrorKind::UnexpectedReply), or a
        /// [`Tls`](NodeErrorKind::Tls) failure.
        cause: Box<NodeErrorKind>,
    },
    /// A TLS connection failed. In the handshake (a certificate that does not verify, a name
    /// that does not match, a plaintext port on a `rediss://` URL, a TLS port on a `redis://`
    /// one, a client certificate the server wants), it is the cause of a
    /// [`Setup`](NodeErrorKind::Setup) failure whose command is `TLS`: a configuration error,
    /// reported at once and never retried, with nothing sent but the handshake. On its own, it
    /// is a TLS connection that broke later (a bad record), failed like any broken connection.
    Tls(TlsFailure),
}

/// The start of the message of a failure that says a Sentinel member has no master because
/// of its sentinels (none reached, none knows the service, none answered yet).
pub(crate) const NO_MASTER: &str = "MASTERDOWN no master for the service ";

impl NodeErrorKind {
    /// Whether a Sentinel member's failure is its sentinels' (no master named, the URL
    /// refused by them) rather than its master's.
    pub(crate) fn is_sentinels(&self) -> bool {
        match self {
            NodeErrorKind::Server { message, .. } => message.starts_with(NO_MASTER),
            NodeErrorKind::Setup { command, .. } => command.starts_with("SENTINEL"),
            _ => false,
        }
    }
}

/// Why a TLS connection failed; see [`NodeErrorKind::Tls`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsFailure {
    /// The server's certificate does not verify against the trusted roots (the system's, and
    /// the CAs given with [`tls_ca_file`](crate::ClientBuilder::tls_ca_file)): an unknown
    /// issuer, an expired certificate, a bad signature. TLS's own words follow.
    Certificate(String),
    /// The server's certificate is valid, but not for the host name or address of the URL.
    NameMismatch(String),
    /// The server wants a client certificate and was given none, or none it accepts (see
    /// [`tls_client_cert`](crate::ClientBuilder::tls_client_cert)).
    ClientCertificate(String),
    /// The server does not speak TLS: it answered the handshake with something else, or did
    /// not answer it within the connect timeout. Most often a plaintext port on a `rediss://`
    /// URL (a plaintext Redis waits, silent, for the end of a line that never comes).
    NotTls,
    /// The server closed the connection at the first plaintext bytes, and answers a TLS
    /// handshake: a TLS port on a `redis://` URL (use `rediss://`).
    TlsPort,
    /// The handshake failed for another reason (no protocol version or cipher suite in
    /// common, an alert from the server), or the connection broke with a bad TLS record.
    Handshake(String),
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFailure::Certificate(why) => {
                write!(f, "the server's certificate does not verify: {why}")
            }
            TlsFailure::NameMismatch(why) => write!(
                f,
                "the server's certificate is not for the node's host name or address: {why}"
            ),
            TlsFailure::ClientCertificate(why) => write!(
                f,
                "the server wants a client certificate it accepts (tls_client_cert): {why}"
            ),
            TlsFailure::NotTls => f.write_str(
                "the server did not answer the TLS handshake as a TLS server: a plaintext port \
                 on a rediss:// URL? (use redis://)",
            ),
            TlsFailure::TlsPort => f.write_str(
                "the server closed the connection at the first plaintext bytes and answers TLS: \
                 a TLS port on a redis:// URL? (use rediss://)",
            ),
            TlsFailure::Handshake(why) => write!(f, "the TLS handshake failed: {why}"),
        }
    }
}

impl fmt::Display for NodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeErrorKind::Timeout => f.write_str("timed out"),
            NodeErrorKind::Connect(k) => write!(f, "connect failed: {k}"),
            NodeErrorKind::Backoff => f.write_str("waiting to reconnect after a failure"),
            NodeErrorKind::Io(k) => write!(f, "connection broke: {k}"),
            NodeErrorKind::Protocol(e) => write!(f, "protocol error: {e}"),
            NodeErrorKind::Server { message, .. } => write!(f, "server error: {message}"),
            NodeErrorKind::UnexpectedReply => f.write_str("unexpected reply"),
            NodeErrorKind::SameServer { node } => write!(
                f,
                "the same server as node {node} (the same run_id): one server must not count \
                 twice towards the quorum"
            ),
            NodeErrorKind::ServerChanged => f.write_str(
                "the server changed version while its connection was set up again; \
                 the command was not sent",
            ),
            NodeErrorKind::Setup { command, cause } => {
                write!(f, "connection setup failed at {command}: {cause}")
            }
            NodeErrorKind::Tls(why) => write!(f, "TLS: {why}"),
        }
    }
}
