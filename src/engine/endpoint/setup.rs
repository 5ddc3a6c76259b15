//! A connection's setup: the commands sent before anything else, what their replies mean, and
//! what they teach about the node's server (its identity, and the commands it offers).
#![forbid(unsafe_code)]

use crate::engine::ops::{Caps, SCRIPTS};
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply, ServerErrorKind};
use crate::url::NodeAddr;

/// One command of a connection's setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    /// `AUTH [user] password`, as the URL asks; must succeed.
    Auth,
    /// `SELECT db`, as the URL asks; must succeed.
    Select,
    /// `SCRIPT LOAD`: a refusal (ACLs) is tolerated, EVALSHA then falls back to EVAL.
    ScriptLoad,
    /// `INFO server`: the server's name, version and run id; a refusal is tolerated.
    Info,
    /// `COMMAND INFO DELEX HSETEX`, whose answer (with the server's identity) says which
    /// commands the node offers; a refusal is tolerated.
    Caps,
    /// `ROLE`, on a master found through Sentinel: it must say `master` (a replica, or a
    /// former master demoted since the sentinels answered, is never used).
    Role,
}

impl Setup {
    pub fn command(self) -> &'static str {
        match self {
            Setup::Auth => "AUTH",
            Setup::Select => "SELECT",
            Setup::ScriptLoad => "SCRIPT LOAD",
            Setup::Info => "INFO",
            Setup::Caps => "COMMAND INFO",
            Setup::Role => "ROLE",
        }
    }

    /// The connection is of no use unless this command succeeds.
    fn required(self) -> bool {
        matches!(self, Setup::Auth | Setup::Select)
    }

    /// What an error reply to this command means: `None` when it is tolerated, a
    /// [`NodeErrorKind::Setup`] when the node's URL or configuration is wrong, a plain server
    /// error (failing the connection, to be retried later) when it is transient.
    fn refused(self, message: &[u8]) -> Option<NodeErrorKind> {
        let kind = ServerErrorKind::of(message);
        let transient = matches!(
            kind,
            ServerErrorKind::Loading
                | ServerErrorKind::Busy
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::Oom
        ) || message.starts_with(b"ERR max number of clients");
        // Wrong or missing credentials show on whichever command comes first; so does protected
        // mode, which refuses every command from this address.
        let config = !transient
            && (self.required()
                || matches!(kind, ServerErrorKind::NoAuth | ServerErrorKind::WrongPass)
                || message.starts_with(b"DENIED"));
        let error = crate::engine::ops::server_error(message);
        if config {
            Some(self.failed(error))
        } else {
            self.required().then_some(error)
        }
    }

    /// Checks this command's reply: an error the connection cannot live with, or a reply no
    /// Redis server gives to `AUTH` or `SELECT`, fails it.
    pub fn check(self, reply: &Reply<'_>) -> Result<(), NodeErrorKind> {
        if self == Setup::Role {
            return check_role(reply);
        }
        match reply {
            Reply::Error(m) => self.refused(m).map_or(Ok(()), Err),
            // AUTH and SELECT answer +OK and nothing else.
            Reply::Simple(b"OK") => Ok(()),
            _ if self.required() => Err(self.failed(NodeErrorKind::UnexpectedReply)),
            _ => Ok(()),
        }
    }

    /// The configuration error for this command failing with `cause`.
    pub fn failed(self, cause: NodeErrorKind) -> NodeErrorKind {
        NodeErrorKind::Setup {
            command: self.command(),
            cause: Box::new(cause),
        }
    }
}

/// What a `ROLE` reply says of a server the sentinels named as the master: `master`, or the
/// failure that keeps every command off it (another role: the connection fails, and the
/// sentinels are asked again; a refusal of `ROLE` itself, which no command could do
/// without: a configuration error).
fn check_role(reply: &Reply<'_>) -> Result<(), NodeErrorKind> {
    match reply {
        Reply::Array(Some(items))
            if matches!(items.first(), Some(Reply::Bulk(Some(b"master")))) =>
        {
            Ok(())
        }
        Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::Loading => {
            Err(crate::engine::ops::server_error(m))
        }
        Reply::Error(m) => Err(Setup::Role.failed(crate::engine::ops::server_error(m))),
        Reply::Array(Some(items)) => {
            let role = match items.first() {
                Some(Reply::Bulk(Some(r))) => String::from_utf8_lossy(r).into_owned(),
                _ => "unknown".to_owned(),
            };
            Err(NodeErrorKind::Server {
                kind: ServerErrorKind::Other,
                message: format!(
                    "ROLE says {role}: the server the sentinels named is not a master (any more)"
                ),
            })
        }
        _ => Err(NodeErrorKind::UnexpectedReply),
    }
}

/// Which server software answers at a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Software {
    /// Not known: `INFO` was refused, or not answered yet.
    #[default]
    Unknown,
    /// Redis.
    Redis,
    /// Valkey.
    Valkey,
}

/// What a node's setup said about its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Server {
    pub software: Software,
    /// `major.minor.patch`, `(0, 0, 0)` when unknown.
    pub version: (u16, u16, u16),
    /// The server's `run_id` (40 hex digits), which names one server process whatever address
    /// reaches it; `None` when unknown.
    pub run_id: Option<[u8; 40]>,
    /// The commands its lock operations may use.
    pub caps: Caps,
}

impl Server {
    /// Reads the `INFO server` text: `server_name` (Valkey says `valkey`; Redis 7 and 8 have no
    /// such line, or say `redis`), `valkey_version` or `redis_version`, and `run_id`.
    pub fn read_info(&mut self, text: &[u8]) {
        let mut redis_version = None;
        let mut valkey_version = None;
        let mut software = Software::Redis;
        for line in text.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (name, value) = (&line[..colon], &line[colon + 1..]);
            match name {
                b"server_name" if value == b"valkey" => software = Software::Valkey,
                b"redis_version" => redis_version = parse_version(value),
                b"valkey_version" => valkey_version = parse_version(value),
                b"run_id" if value.len() == 40 => {
                    let mut id = [0u8; 40];
                    id.copy_from_slice(value);
                    self.run_id = Some(id);
                }
                _ => {}
            }
        }
        if valkey_version.is_some() {
            software = Software::Valkey;
        }
        self.software = software;
        self.version = match software {
            Software::Valkey => valkey_version.or(redis_version),
            _ => redis_version,
        }
        .unwrap_or_default();
    }

    /// What is known of a node before its first setup: nothing, but whether it is a master
    /// of a Redis Cluster member, which its URL says (see [`Caps::sharded`]).
    pub fn for_member(cluster: bool) -> Server {
        let mut s = Server::default();
        s.caps.sharded = cluster;
        s
    }

    /// Which of the newer commands this server's lock operations use, from what `COMMAND
    /// INFO DELEX HSETEX` says exists and what the server is. A path is used only on servers
    /// whose behaviour the project's tests verify: Redis 8.0 and later for `HSETEX` (the read-
    /// write lock without Lua), Redis 8.4 and later for `DELEX`. Valkey, and a server that did
    /// not say what it is, keep the scripts.
    pub fn set_caps(&mut self, command_info: &Reply<'_>) {
        let offered = crate::engine::rw::caps_of(command_info);
        let redis = self.software == Software::Redis;
        let at_least = |major: u16, minor: u16| (self.version.0, self.version.1) >= (major, minor);
        self.caps = Caps {
            hsetex: offered.hsetex && redis && at_least(8, 0),
            delex: offered.delex && redis && at_least(8, 4),
            sharded: self.caps.sharded,
        };
    }
}

fn parse_version(v: &[u8]) -> Option<(u16, u16, u16)> {
    let mut parts = v.split(|&b| b == b'.').map(|p| {
        std::str::from_utf8(p)
            .ok()
            .and_then(|s| s.trim().parse::<u16>().ok())
    });
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Writes a connection's setup into `out` and pushes each command's step to `steps`: AUTH and
/// SELECT as the URL asks and, for a command connection, every script loaded (so that EVALSHA
/// hits; on a master of a Redis Cluster member, `sharded`, the variants that announce with
/// `SPUBLISH` too), the server's identity, and the commands it offers. A subscriber needs no
/// database and no scripts: channels are global to the server.
pub(crate) fn write(
    out: &mut Vec<u8>,
    node: &NodeAddr,
    commands: bool,
    sharded: bool,
    mut step: impl FnMut(Setup),
) {
    if let Some(password) = &node.password {
        match &node.user {
            Some(user) => resp::encode_command(out, &[b"AUTH", user, password]),
            None => resp::encode_command(out, &[b"AUTH", password]),
        }
        step(Setup::Auth);
    }
    if !commands {
        return;
    }
    if node.db != 0 {
        resp::write_array_len(out, 2);
        resp::write_bulk(out, b"SELECT");
        resp::write_bulk_u64(out, node.db.into());
        step(Setup::Select);
    }
    for script in SCRIPTS {
        resp::encode_command(out, &[b"SCRIPT", b"LOAD", script.body.as_bytes()]);
        step(Setup::ScriptLoad);
        let variant = script.announcing(true);
        if sharded && !std::ptr::eq(variant, *script) {
            resp::encode_command(out, &[b"SCRIPT", b"LOAD", variant.body.as_bytes()]);
            step(Setup::ScriptLoad);
        }
    }
    if node.role {
        // Before anything else that could count: a replica is never used.
        resp::encode_command(out, &[b"ROLE"]);
        step(Setup::Role);
    }
    resp::encode_command(out, &[b"INFO", b"server"]);
    step(Setup::Info);
    // Redis 8.4 has DELEX and 8.0 HSETEX; older servers answer with a nil entry for each
    // command they lack, and ACLs with an error.
    resp::encode_command(out, &[b"COMMAND", b"INFO", b"DELEX", b"HSETEX"]);
    step(Setup::Caps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_server_names_the_software_its_version_and_run_id() {
        let mut s = Server::default();
        s.read_info(
            b"# Server\r\nredis_version:8.2.3\r\nredis_mode:standalone\r\n\
              run_id:0123456789abcdef0123456789abcdef01234567\r\n",
        );
        assert_eq!(s.software, Software::Redis);
        assert_eq!(s.version, (8, 2, 3));
        assert_eq!(s.run_id, Some(*b"0123456789abcdef0123456789abcdef01234567"));
        let mut v = Server::default();
        v.read_info(
            b"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        );
        assert_eq!(
            (v.software, v.version, v.run_id),
            (Software::Valkey, (8, 1, 8), None)
        );
    }

    #[test]
    fn a_master_found_through_sentinel_must_say_master() {
        let master = Reply::Array(Some(vec![
            Reply::Bulk(Some(b"master")),
            Reply::Integer(0),
            Reply::Array(Some(vec![])),
        ]));
        assert_eq!(Setup::Role.check(&master), Ok(()));
        let replica = Reply::Array(Some(vec![
            Reply::Bulk(Some(b"slave")),
            Reply::Bulk(Some(b"127.0.0.1")),
            Reply::Integer(6379),
        ]));
        match Setup::Role.check(&replica) {
            Err(NodeErrorKind::Server { message, .. }) => {
                assert!(message.contains("ROLE says slave"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Setup::Role.check(&Reply::Error(b"NOPERM no")),
            Err(NodeErrorKind::Setup {
                command: "ROLE",
                ..
            })
        ));
        assert!(Setup::Role.check(&Reply::Simple(b"OK")).is_err());
        assert!(Setup::Role.check(&Reply::Array(None)).is_err());
        // Written after the credentials and the database, before anything else.
        let node = crate::url::NodeAddr::parse("redis+sentinel://127.0.0.1:26379/m?db=1")
            .unwrap()
            .sentinel_master("127.0.0.1:6400".parse().unwrap(), "127.0.0.1");
        let mut steps = Vec::new();
        write(&mut Vec::new(), &node, true, false, |s| steps.push(s));
        let role = steps.iter().position(|&s| s == Setup::Role).unwrap();
        assert_eq!(steps[0], Setup::Select);
        assert!(role < steps.iter().position(|&s| s == Setup::Info).unwrap());
    }

    #[test]
    fn newer_commands_are_used_only_on_the_servers_they_were_verified_on() {
        let entry = |name: &'static [u8]| Reply::Array(Some(vec![Reply::Bulk(Some(name))]));
        let both = Reply::Array(Some(vec![entry(b"delex"), entry(b"hsetex")]));
        let caps = |software, version| {
            let mut s = Server {
                software,
                version,
                ..Server::default()
            };
            s.set_caps(&both);
            (s.caps.hsetex, s.caps.delex)
        };
        assert_eq!(caps(Software::Redis, (8, 4, 0)), (true, true));
        assert_eq!(caps(Software::Redis, (8, 2, 3)), (true, false));
        assert_eq!(caps(Software::Redis, (7, 4, 0)), (false, false));
        // Valkey 9 has commands by these names, with other options: not used until verified.
        assert_eq!(caps(Software::Valkey, (9, 0, 0)), (false, false));
        assert_eq!(caps(Software::Unknown, (0, 0, 0)), (false, false));
    }
}
