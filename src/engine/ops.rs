//! The lock algorithms' commands: what each node is sent, and what each reply means.
//!
//! An [`Op`] encodes its command for one node and reads that node's reply as a [`Vote`]. Scripts
//! go out as `EVALSHA` with a digest computed at compile time; a node that answers `NOSCRIPT`
//! gets the same call again as `EVAL` with the script's body.
#![forbid(unsafe_code)]

pub use crate::engine::scripts::{Script, EXTEND, RELEASE, SCRIPTS};
use crate::engine::{keys, Vote};
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply, ServerErrorKind};

/// How a script is sent: by digest, or (after `NOSCRIPT`) with its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptForm {
    /// `EVALSHA digest ...`
    Sha,
    /// `EVAL body ...`
    Body,
}

/// One argument of a command.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// Bytes as they are.
    Bytes(&'a [u8]),
    /// A number, sent as its decimal digits.
    Num(u64),
    /// The pub/sub channel on which releases of this resource key are announced
    /// ([`keys::wake_channel_for`]).
    Wake(keys::Name<'a>),
}

fn write_arg(out: &mut Vec<u8>, arg: Arg<'_>) {
    match arg {
        Arg::Bytes(b) => resp::write_bulk(out, b),
        Arg::Num(n) => resp::write_bulk_u64(out, n),
        Arg::Wake(name) => name.write_bulk(out),
    }
}

/// Writes `EVALSHA`/`EVAL` of `script` with `keys` and `args`.
pub fn write_eval(
    out: &mut Vec<u8>,
    script: &Script,
    form: ScriptForm,
    keys: &[&[u8]],
    args: &[Arg<'_>],
) {
    resp::write_array_len(out, 3 + keys.len() + args.len());
    match form {
        ScriptForm::Sha => {
            resp::write_bulk(out, b"EVALSHA");
            resp::write_bulk(out, &script.sha);
        }
        ScriptForm::Body => {
            resp::write_bulk(out, b"EVAL");
            resp::write_bulk(out, script.body.as_bytes());
        }
    }
    resp::write_bulk_u64(out, keys.len() as u64);
    keys.iter().for_each(|k| resp::write_bulk(out, k));
    args.iter().for_each(|a| write_arg(out, *a));
}

/// What a reply means to the lock algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A vote for the round.
    Vote(Vote),
    /// The node does not have the script cached: send it again with its body.
    NoScript,
}

/// What a node's server offers beyond Redis 7.0, learnt as its connection is set up. Until
/// the answer arrives, and for servers without it, everything is `false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// `DELEX key IFEQ value` (Redis 8.4): compare-and-delete without a script.
    pub delex: bool,
    /// Hash-field expiry with `HSETEX` (Redis 8.0): the read-preferring read-write lock goes
    /// without Lua there (see `engine::rw`, "Native nodes").
    pub hsetex: bool,
    /// The node is a master of a Redis Cluster member (its URL says so, whatever it
    /// offers): releases are announced with `SPUBLISH`, on the wake channel in the lock's
    /// slot ([`keys::wake_channel_for`]), to that shard only.
    pub sharded: bool,
}

/// A command fanned out to every node.
pub trait Op {
    /// Writes the command for one node into `out`. `form` matters only to scripts.
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm);
    /// Writes the command for a node whose server offers `caps`; ops that can use a newer
    /// command there override this. Returns how many commands it wrote before the last one,
    /// whose reply is the vote (the replies to those before it are read and dropped: a
    /// `MULTI` ... `EXEC` block is voted on by its `EXEC`). A `NOSCRIPT` resend always uses
    /// [`encode`](Op::encode).
    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        let _ = caps;
        self.encode(out, form);
        0
    }
    /// Reads one node's reply.
    fn classify(&self, reply: &Reply<'_>) -> Verdict;
    /// For an acquire behind a fair queue: the waiter's rank that one node's reply gives (how
    /// many entries ahead of it must leave before it may pass; see `Ranks` in the engine's
    /// `fair` module). `None` for every other op, and for a reply without one.
    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        let _ = reply;
        None
    }
}

/// A node failure for an error reply.
pub fn server_error(message: &[u8]) -> NodeErrorKind {
    NodeErrorKind::Server {
        kind: ServerErrorKind::of(message),
        message: String::from_utf8_lossy(message).into_owned(),
    }
}

/// The vote for an error reply: `NOSCRIPT` asks for the body, anything else is a node failure.
pub fn error_verdict(message: &[u8]) -> Verdict {
    match ServerErrorKind::of(message) {
        ServerErrorKind::NoScript => Verdict::NoScript,
        _ => Verdict::Vote(Vote::Failed(server_error(message))),
    }
}

/// The vote for a script that returns 1 for yes and 0 for no.
pub fn int_verdict(reply: &Reply<'_>) -> Verdict {
    match reply {
        Reply::Integer(1) => Verdict::Vote(Vote::Yes),
        Reply::Integer(0) => Verdict::Vote(Vote::No),
        Reply::Error(m) => error_verdict(m),
        _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
    }
}

/// Mutex acquire: `SET key token NX PX ttl`.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for Acquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, _form: ScriptForm) {
        resp::write_array_len(out, 6);
        resp::write_bulk(out, b"SET");
        resp::write_bulk(out, self.key);
        resp::write_bulk(out, self.token);
        resp::write_bulk(out, b"NX");
        resp::write_bulk(out, b"PX");
        resp::write_bulk_u64(out, self.ttl_ms);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Simple(b"OK") => Verdict::Vote(Vote::Yes),
            Reply::Bulk(None) => Verdict::Vote(Vote::No),
            Reply::Error(m) => error_verdict(m),
            _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
        }
    }
}

/// Mutex release: compare-and-delete. Every integer is an acknowledgement: 0 only means the key
/// had already expired or was never set on that node.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
}

impl Release<'_> {
    /// The release, announced with `SPUBLISH` when `sharded` (see [`Caps::sharded`]).
    fn write(&self, out: &mut Vec<u8>, form: ScriptForm, sharded: bool) {
        write_eval(
            out,
            RELEASE.announcing(sharded),
            form,
            &[self.key],
            &[
                Arg::Bytes(self.token),
                Arg::Wake(keys::wake_channel_for(
                    self.key,
                    keys::Family::Mutex,
                    sharded,
                )),
            ],
        );
    }
}

impl Op for Release<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.write(out, form, false);
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        self.write(out, form, caps.sharded);
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(0 | 1) => Verdict::Vote(Vote::Yes),
            other => int_verdict(other),
        }
    }
}

/// Mutex extend: compare-and-PEXPIRE.
#[derive(Debug, Clone, Copy)]
pub struct Extend<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for Extend<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &EXTEND,
            form,
            &[self.key],
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    /// `WRONGTYPE`: the key holds something else (a read-write lock's reader hash), so not
    /// our token.
    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::WrongType => {
                Verdict::Vote(Vote::No)
            }
            other => int_verdict(other),
        }
    }
}
