//! The settings a client runs with, as the builder checked them.
//!
//! A leaf: the driver and the engine read [`Config`] without knowing the client or the guards.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::error::{InvalidArgument, NodeErrorKind, NodeFailure};
use crate::resp::Limits;
use crate::url::NodeAddr;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// The most nodes one client may use.
pub const MAX_NODES: usize = 64;
/// The longest TTL accepted: 2^44 ms, a little over 557 years. Longer ones could overflow the
/// server's millisecond clock arithmetic.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 44);

/// The most keys one all-or-none lock may cover. Each node runs one script over the whole set,
/// which blocks that node for its duration, so the set is kept small.
pub const MAX_LOCK_ALL_KEYS: usize = 256;

/// Rejects keys that are empty or longer than [`MAX_KEY_LEN`].
pub(crate) fn check_key(key: &[u8]) -> Result<(), InvalidArgument> {
    if key.is_empty() {
        return Err(InvalidArgument::EmptyKey);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(InvalidArgument::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// Settings shared by every thread using a client.
#[derive(Debug)]
pub(crate) struct Config {
    pub nodes: Vec<NodeAddr>,
    pub node_timeout: Duration,
    pub connect_timeout: Duration,
    /// How long a peer may stay silent at the TCP level before its connection is given up.
    pub dead_peer_timeout: Duration,
    pub retry_count: u32,
    pub retry_delay: Duration,
    pub wait_timeout: Duration,
    pub drift_factor: f64,
    pub fair: bool,
    pub fair_after: Duration,
    pub limits: Limits,
    pub rw_policy: RwPolicy,
    /// The master each Sentinel member uses (by node index), as its endpoint last set it: a
    /// failure of the master names it.
    pub masters: SentinelMasters,
}

/// The masters Sentinel members use, for the failures' wording (see [`Config::failure`]).
#[derive(Debug, Default)]
pub(crate) struct SentinelMasters(std::sync::Mutex<Vec<Option<std::net::SocketAddr>>>);

impl SentinelMasters {
    /// Member `node` now uses the master at `addr`.
    pub fn set(&self, node: usize, addr: std::net::SocketAddr) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() <= node {
            all.resize(node + 1, None);
        }
        all[node] = Some(addr);
    }

    fn get(&self, node: usize) -> Option<std::net::SocketAddr> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get(node).copied().flatten()
    }
}

impl Config {
    /// A failure of node `node`, named by its address (and, for a connect that failed, by
    /// the addresses its host name resolved to, which were tried in turn). A Sentinel
    /// member's is named by its sentinels and service, and, when it is its master's failure,
    /// by that master too: `127.0.0.1:6380, master of "svc" named by 127.0.0.1:26379,…`.
    pub fn failure(&self, node: usize, kind: NodeErrorKind) -> NodeFailure {
        let addr = match (self.nodes.get(node), &kind) {
            (Some(n), _) if n.sentinel.is_some() => {
                let service = n.sentinel.as_ref().map_or("", |s| s.service.as_str());
                match self.masters.get(node) {
                    Some(master) if !kind.is_sentinels() => {
                        format!("{master}, master of {service:?} named by {}", n.display)
                    }
                    _ => format!("{}/{service}", n.display),
                }
            }
            (Some(n), NodeErrorKind::Connect(_)) => n.tried(),
            (Some(n), _) => n.display.clone(),
            (None, _) => String::new(),
        };
        NodeFailure { node, addr, kind }
    }
}

/// Whom a read-write lock favours when readers hold it and a writer waits. Chosen per client
/// with [`ClientBuilder::rw_policy`](crate::ClientBuilder::rw_policy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RwPolicy {
    /// New readers get in whenever no writer holds the lock, as in the read-write lock design it comes from. Readers wait the
    /// least, but a stream of overlapping readers can keep a writer out for ever.
    #[default]
    ReadPreferring,
    /// A writer that has to wait registers an intent on every node it reaches. New readers are
    /// refused while the intent lives, so the readers in place drain and the writer gets in
    /// within one reader hold (at most the readers' TTL) plus one retry delay. The intent is
    /// refreshed on every attempt, withdrawn when the writer gets the lock or gives up, and
    /// expires on its own (after twice the retry delay plus twice the node timeout) if the
    /// writer dies.
    ///
    /// With [`fair`](crate::ClientBuilder::fair) queueing, the queue decides who goes next:
    /// readers that arrive after a queued writer queue behind it, which already keeps the
    /// writer from starving, and a reader the queue lets through (queued, with only readers
    /// ahead of it) is never refused by an intent, so a writer queued behind it cannot hold it
    /// back. Intents then only hold back readers that have not joined the queue (an empty one,
    /// before [`fair_after`](crate::ClientBuilder::fair_after)).
    WritePreferring,
}
