//! A simulated Redis server around a node's memory ([`Node`]): what a connection meets besides
//! the data. `AUTH` and `SELECT`; `INFO server` with the server's version and run id;
//! `COMMAND INFO DELEX HSETEX` as that version answers it (Redis 7 has neither; Redis 8.2 has
//! `HSETEX`, and answers the hash-field commands, which Redis 7 does not know); `MULTI`/`EXEC`
//! per connection, with commands refused when queued and the `EXEC` then answering
//! `EXECABORT`; subscriptions; a server still loading its data (`LOADING`); and a server that
//! refuses writes while it still answers reads and `PUBLISH`:
//!
//! - `READONLY` (a replica) and `MISCONF` (a failed save): every write command is refused,
//!   inside `MULTI` when queued. A script runs until it calls a write command, which is refused
//!   (the script fails with the refusal, nothing written); a script that only reads answers.
//! - `OOM` (`maxmemory` reached, no eviction): only commands that may grow memory (`SET`,
//!   `ZADD`, `HSETEX`) are refused; deletes and expiry changes run. Inside `MULTI`, Redis 7
//!   refuses every command when queued, Redis 8 only those that may grow memory. A script fails
//!   at its first call of a command that may grow memory, unless it already wrote.
//!
//! `diff.rs` checks these against real servers of both versions. Nothing here is about locks.

use std::collections::BTreeSet;

use super::node::{Node, Refusals};
use crate::resp::{self, Limits, Reply, Status};

/// Why a server refuses writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A replica (`REPLICAOF` a master it cannot reach): `READONLY`.
    ReadOnly,
    /// The last save failed, and `stop-writes-on-bgsave-error` is on: `MISCONF`.
    Misconf,
    /// `maxmemory` reached with `noeviction`: `OOM`, for commands that may grow memory.
    Oom,
}

impl Refusal {
    /// The error a refused command answers.
    pub fn message(self) -> &'static [u8] {
        match self {
            Refusal::ReadOnly => b"READONLY You can't write against a read only replica.",
            Refusal::Misconf => {
                b"MISCONF Redis is configured to save RDB snapshots, but it's currently unable \
                  to persist to disk. Commands that may modify the data set are disabled, \
                  because this instance is configured to report errors during writes if RDB \
                  snapshotting fails (stop-writes-on-bgsave-error option). Please check the \
                  Redis logs for details about the RDB error."
            }
            Refusal::Oom => b"OOM command not allowed when used memory > 'maxmemory'.",
        }
    }

    /// Whether a command with `flags` is refused, outside a transaction.
    fn refuses(self, flags: Flags) -> bool {
        match self {
            Refusal::ReadOnly | Refusal::Misconf => flags.write,
            Refusal::Oom => flags.denyoom,
        }
    }
}

/// What Redis's command table says of a command, as far as the simulation needs it.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    /// It may modify the data.
    write: bool,
    /// It may grow memory.
    denyoom: bool,
    /// It runs while the server loads its data.
    loading: bool,
}

/// The command table: `None` for a command this server does not know.
fn flags(name: &[u8], version: (u16, u16, u16)) -> Option<Flags> {
    let f = |write, denyoom, loading| Flags {
        write,
        denyoom,
        loading,
    };
    Some(match name {
        b"SET" => f(true, true, false),
        b"ZADD" => f(true, true, false),
        b"HSETEX" if version.0 >= 8 => f(true, true, false),
        b"DEL" | b"PEXPIRE" | b"ZREM" | b"ZREMRANGEBYSCORE" | b"HDEL" | b"FLUSHALL" => {
            f(true, false, false)
        }
        b"HPEXPIRE" if version.0 >= 8 => f(true, false, false),
        b"HPTTL" if version.0 >= 8 => f(false, false, false),
        b"GET" | b"EXISTS" | b"PTTL" | b"ZCARD" | b"ZSCORE" | b"ZRANGE" | b"ZRANGEBYSCORE"
        | b"HRANDFIELD" | b"HLEN" | b"TYPE" | b"SCRIPT" | b"PING" => f(false, false, false),
        // A script's own calls decide (see `run`).
        b"EVAL" | b"EVALSHA" => Flags::default(),
        b"PUBLISH" | b"AUTH" | b"SELECT" | b"INFO" | b"COMMAND" | b"MULTI" | b"EXEC"
        | b"SUBSCRIBE" | b"UNSUBSCRIBE" | b"TIME" => f(false, false, true),
        // Sharded pub/sub (Redis 7.0 and later).
        b"SPUBLISH" | b"SSUBSCRIBE" | b"SUNSUBSCRIBE" => f(false, false, true),
        _ => return None,
    })
}

/// What Redis 8.2.3 answers for `HSETEX` in `COMMAND INFO`, byte for byte.
const HSETEX_INFO_82: &[u8] =
    b"*10\r\n$6\r\nhsetex\r\n:-6\r\n*3\r\n+write\r\n+denyoom\r\n+fast\r\n\
:1\r\n:1\r\n:1\r\n*3\r\n+@write\r\n+@hash\r\n+@fast\r\n*0\r\n*1\r\n*6\r\n$5\r\nflags\r\n*2\r\n\
+RW\r\n+update\r\n$12\r\nbegin_search\r\n*4\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n*2\r\n\
$5\r\nindex\r\n:1\r\n$9\r\nfind_keys\r\n*4\r\n$4\r\ntype\r\n$5\r\nrange\r\n$4\r\nspec\r\n*6\r\n\
$7\r\nlastkey\r\n:0\r\n$7\r\nkeystep\r\n:1\r\n$5\r\nlimit\r\n:0\r\n*0\r\n";

/// A simulated server: its data, what it is, and how it refuses.
#[derive(Debug)]
pub(crate) struct Server {
    pub node: Node,
    /// `major.minor.patch`: 7.x has no hash-field commands, 8.x has them.
    pub version: (u16, u16, u16),
    /// The process's run id (a new one at each start).
    pub run_id: [u8; 40],
    /// `requirepass`, if set.
    pub password: Option<Vec<u8>>,
    /// It refuses writes, and how.
    pub refusal: Option<Refusal>,
    /// It is still loading its data: commands that cannot run meanwhile answer `LOADING`.
    pub loading: bool,
}

/// One connection's state on the server.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// Bytes received and not yet framed into commands.
    input: Vec<u8>,
    /// Bytes received so far on this connection (where the next byte of input is).
    pub received: u64,
    authed: bool,
    /// The commands queued since `MULTI`, and whether one was refused when queued.
    multi: Option<(Vec<Vec<u8>>, bool)>,
    /// The channels it is subscribed to.
    pub channels: BTreeSet<Vec<u8>>,
    /// The shard channels it is subscribed to (`SSUBSCRIBE`).
    pub shard_channels: BTreeSet<Vec<u8>>,
    /// On a cluster node: `ASKING` came, for the next command (or the transaction under way).
    pub asking: bool,
}

impl Session {
    /// `bytes` arrived: every command now complete, in order, with where it ends in the
    /// connection's stream. A partial command waits for the rest (and never runs if the rest
    /// does not come).
    pub fn receive(&mut self, bytes: &[u8]) -> Vec<(Vec<u8>, u64)> {
        self.input.extend_from_slice(bytes);
        let start = self.received;
        self.received += bytes.len() as u64;
        let before = start - (self.input.len() - bytes.len()) as u64;
        let mut out = Vec::new();
        let mut at = 0;
        while at < self.input.len() {
            match resp::scan(&self.input[at..], &Limits::default()) {
                Ok(Status::Complete(used)) => {
                    out.push((
                        self.input[at..at + used].to_vec(),
                        before + (at + used) as u64,
                    ));
                    at += used;
                }
                Ok(Status::Partial) => break,
                Err(e) => panic!("the client wrote something that is not RESP: {e:?}"),
            }
        }
        self.input.drain(..at);
        out
    }
}

impl Session {
    /// Whether `AUTH` succeeded on it.
    pub fn authed(&self) -> bool {
        self.authed
    }

    /// The commands queued since `MULTI`, if a transaction is under way.
    pub fn queued(&self) -> Option<&[Vec<u8>]> {
        self.multi.as_ref().map(|(q, _)| q.as_slice())
    }

    /// A command queued in the transaction under way was refused: its `EXEC` answers
    /// `EXECABORT`.
    pub fn flag_multi(&mut self) {
        if let Some((_, dirty)) = &mut self.multi {
            *dirty = true;
        }
    }

    /// The transaction under way is discarded (its `EXEC` was redirected).
    pub fn discard_multi(&mut self) {
        self.multi = None;
    }
}

/// The words of a command, or `None` if it is not an array of bulk strings.
fn words(command: &[u8]) -> Option<Vec<&[u8]>> {
    match resp::decode(command, &Limits::default()) {
        Ok(Status::Complete((Reply::Array(Some(items)), _))) => items
            .into_iter()
            .map(|r| match r {
                Reply::Bulk(Some(b)) => Some(b),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn error(out: &mut Vec<u8>, message: &[u8]) {
    out.push(b'-');
    out.extend_from_slice(message);
    out.extend_from_slice(b"\r\n");
}

impl Server {
    /// A server of `version` around `node`.
    pub fn new(node: Node, version: (u16, u16, u16), run_id: [u8; 40]) -> Server {
        Server {
            node,
            version,
            run_id,
            password: None,
            refusal: None,
            loading: false,
        }
    }

    /// Whether it has the hash-field commands (`HSETEX`, `HPEXPIRE`, `HPTTL`).
    pub fn has_hash_fields(&self) -> bool {
        self.version.0 >= 8
    }

    /// Runs one command of `session` at node time `now_ms`, and appends its reply (or, for a
    /// subscription, its confirmations) to `out`.
    pub fn execute(
        &mut self,
        session: &mut Session,
        now_ms: i64,
        command: &[u8],
        out: &mut Vec<u8>,
    ) {
        let Some(args) = words(command) else {
            return error(
                out,
                b"ERR Protocol error: expected an array of bulk strings",
            );
        };
        let Some((name, rest)) = args.split_first() else {
            return error(out, b"ERR Protocol error: empty command");
        };
        let name = name.to_ascii_uppercase();
        let Some(flags) = flags(&name, self.version) else {
            let mut m = format!(
                "ERR unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(args[0])
            );
            for a in rest {
                m.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
            }
            if let Some((_, dirty)) = &mut session.multi {
                *dirty = true;
            }
            return error(out, m.as_bytes());
        };
        if name == b"AUTH" {
            return self.auth(session, rest, out);
        }
        if self.password.is_some() && !session.authed {
            if let Some((_, dirty)) = &mut session.multi {
                *dirty = true;
            }
            return error(out, b"NOAUTH Authentication required.");
        }
        if let Some(refused) = self.refused(flags, session.multi.is_some(), &name) {
            if let Some((_, dirty)) = &mut session.multi {
                *dirty = true;
            }
            return error(out, refused);
        }
        if self.loading && !flags.loading {
            if let Some((_, dirty)) = &mut session.multi {
                *dirty = true;
            }
            return error(out, b"LOADING Redis is loading the dataset in memory");
        }
        match (name.as_slice(), &mut session.multi) {
            (b"MULTI", Some((_, dirty))) => {
                *dirty = true;
                error(out, b"ERR MULTI calls can not be nested")
            }
            (b"MULTI", None) => {
                session.multi = Some((Vec::new(), false));
                out.extend_from_slice(b"+OK\r\n");
            }
            (b"EXEC", None) => error(out, b"ERR EXEC without MULTI"),
            (b"EXEC", Some(_)) => {
                let (queued, dirty) = session.multi.take().unwrap_or_default();
                if dirty {
                    return error(
                        out,
                        b"EXECABORT Transaction discarded because of previous errors.",
                    );
                }
                resp::write_array_len(out, queued.len());
                for c in &queued {
                    self.run(now_ms, c, out);
                }
            }
            (_, Some((queued, _))) => {
                queued.push(command.to_vec());
                out.extend_from_slice(b"+QUEUED\r\n");
            }
            (b"SELECT", None) => match std::str::from_utf8(rest.first().copied().unwrap_or(b""))
                .ok()
                .and_then(|d| d.parse::<u32>().ok())
            {
                Some(db) if db < 16 => out.extend_from_slice(b"+OK\r\n"),
                _ => error(out, b"ERR DB index is out of range"),
            },
            (b"INFO", None) => {
                let text = format!(
                    "# Server\r\nredis_version:{}.{}.{}\r\nredis_mode:standalone\r\nrun_id:{}\r\n",
                    self.version.0,
                    self.version.1,
                    self.version.2,
                    String::from_utf8_lossy(&self.run_id)
                );
                resp::write_bulk(out, text.as_bytes());
            }
            (b"COMMAND", None) => {
                resp::write_array_len(out, rest.len().saturating_sub(1));
                for c in rest.iter().skip(1) {
                    if c.eq_ignore_ascii_case(b"HSETEX") && self.has_hash_fields() {
                        out.extend_from_slice(HSETEX_INFO_82);
                    } else {
                        out.extend_from_slice(b"$-1\r\n");
                    }
                }
            }
            (b"SUBSCRIBE" | b"UNSUBSCRIBE" | b"SSUBSCRIBE" | b"SUNSUBSCRIBE", None) => {
                let sharded = matches!(&name[..], b"SSUBSCRIBE" | b"SUNSUBSCRIBE");
                let subscribe = matches!(&name[..], b"SUBSCRIBE" | b"SSUBSCRIBE");
                let kind = name.to_ascii_lowercase();
                let channels = if sharded {
                    &mut session.shard_channels
                } else {
                    &mut session.channels
                };
                for ch in rest {
                    if subscribe {
                        channels.insert(ch.to_vec());
                    } else {
                        channels.remove(*ch);
                    }
                    subscription_reply(out, &kind, ch, channels.len());
                }
            }
            _ => self.run(now_ms, command, out),
        }
    }

    /// `AUTH [user] password`.
    fn auth(&mut self, session: &mut Session, rest: &[&[u8]], out: &mut Vec<u8>) {
        match (&self.password, rest.last()) {
            (None, _) => error(
                out,
                b"ERR AUTH <password> called without any password configured for the default \
                  user. Are you sure your configuration is correct?",
            ),
            (Some(p), Some(given)) if p.as_slice() == *given => {
                session.authed = true;
                out.extend_from_slice(b"+OK\r\n");
            }
            _ => error(
                out,
                b"WRONGPASS invalid username-password pair or user is disabled.",
            ),
        }
    }

    /// Whether a command with `flags` is refused now (`in_multi`: queued in a transaction),
    /// and with what.
    fn refused(&self, flags: Flags, in_multi: bool, name: &[u8]) -> Option<&'static [u8]> {
        let refusal = self.refusal?;
        let exempt = matches!(name, b"EXEC" | b"AUTH");
        let refused = match refusal {
            // Redis 7 refuses every command queued in a transaction once out of memory.
            Refusal::Oom if in_multi && self.version.0 < 8 => !exempt && name != b"MULTI",
            // A master that cannot persist refuses PING too.
            Refusal::Misconf if name == b"PING" => true,
            r => r.refuses(flags),
        };
        refused.then(|| refusal.message())
    }

    /// Runs one command on the data. A script runs with the refusal set on the node, which
    /// refuses its write commands inside it as Redis does (`node/lua.rs`).
    fn run(&mut self, now_ms: i64, command: &[u8], out: &mut Vec<u8>) {
        self.node.refusals = Refusals {
            read_only: self.refusal == Some(Refusal::ReadOnly),
            misconf: self.refusal == Some(Refusal::Misconf),
            oom: self.refusal == Some(Refusal::Oom),
        };
        out.extend_from_slice(&self.node.execute(now_ms, command));
    }
}

/// A subscription's confirmation, or the push of a shard channel that a node no longer serves:
/// `kind` (`subscribe`, `ssubscribe`, their `un…` forms), the channel, the count left.
pub(crate) fn subscription_reply(out: &mut Vec<u8>, kind: &[u8], channel: &[u8], count: usize) {
    resp::write_array_len(out, 3);
    resp::write_bulk(out, kind);
    resp::write_bulk(out, channel);
    out.extend_from_slice(format!(":{count}\r\n").as_bytes());
}
