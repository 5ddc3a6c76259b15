//! Node URLs: `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS), bare `host:port`,
//! Unix domain sockets as `unix:///path/to/redis.sock` or `redis+unix:///path…`, and Redis
//! Clusters as `redis+cluster://[user:password@]host:port[,host:port…]` (`rediss+cluster://`
//! with TLS): the seed addresses of one cluster, which is one quorum member; and masters
//! managed by Redis Sentinel as
//! `redis+sentinel://[user:password@]host:port[,host:port…]/SERVICE[?db=N&wait=N&sentinel_user=U&sentinel_password=P]`
//! (`rediss+sentinel://` with TLS): the sentinels to ask for the master of `SERVICE`, which
//! is one quorum member.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use crate::error::InvalidArgument;

/// The default Redis port, used when a `redis://` or `rediss://` URL names none.
const DEFAULT_PORT: u16 = 6379;
/// The default Sentinel port, used when a `redis+sentinel://` URL names none for a sentinel.
const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// The most replicas a URL's `?wait=N` may ask a grant to reach.
const MAX_WAIT: u32 = 16;

/// The schemes a node URL may have, for the message that refuses another one.
const SCHEMES: &str = "the scheme must be redis://, rediss:// (TLS), unix://, redis+unix://, \
     redis+cluster://, rediss+cluster:// (TLS), redis+sentinel:// or rediss+sentinel:// (TLS)";

/// One node, parsed and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAddr {
    /// `host:port` as written, or the socket's path, for messages.
    pub display: String,
    /// The host as written (without brackets), for TLS's server name; empty for a Unix socket.
    pub host: String,
    /// Every address the host resolved to, in the resolver's order, each once; never empty for
    /// TCP, empty for a Unix socket. A connect tries them in turn until one takes it
    /// (`localhost` is often `::1` first, then `127.0.0.1`, and a server may listen on only
    /// one of them).
    pub addrs: Vec<SocketAddr>,
    /// On a cluster URL, the seed host each of `addrs` came from, in the same order: a TLS
    /// connect to a seed checks that seed's own name. Empty otherwise.
    pub seed_hosts: Vec<String>,
    /// The Unix socket's path, for a `unix://` URL.
    pub unix: Option<PathBuf>,
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
    pub user: Option<Vec<u8>>,
    pub password: Option<Vec<u8>>,
    pub db: u32,
    /// `redis+cluster://`: the node is a Redis Cluster, whose seeds are `addrs` (every
    /// address of every seed host, in the URL's order).
    pub cluster: bool,
    /// `?wait=N`: a grant (an acquisition, an extension, a downgrade, a fence raised) counts
    /// only once `WAIT N` says that many replicas have it. 0: no wait.
    pub wait: u32,
    /// `?waitaof=L,R`: a grant counts only once `WAITAOF L R` says the master (`L` = 1) and
    /// `R` replicas fsynced it to their append-only files. `None`: no such wait.
    pub waitaof: Option<(u32, u32)>,
    /// `redis+sentinel://`: the member is the master its sentinels name for a service.
    pub sentinel: Option<Box<SentinelSpec>>,
    /// The setup checks with `ROLE` that the server is a master (a master found through
    /// Sentinel): a replica is never used.
    pub role: bool,
}

/// What a `redis+sentinel://` URL says beyond a node's own settings: whom to ask for the
/// master, and for which service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    /// The name the sentinels monitor the master under.
    pub service: String,
    /// Each sentinel, in the URL's order, with the sentinels' credentials
    /// (`sentinel_user`, `sentinel_password`; none when not given) and the URL's TLS.
    pub sentinels: Vec<NodeAddr>,
}

/// Where one connect goes: one of a node's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    Tcp(SocketAddr),
    Unix(&'a Path),
}

/// The longest Unix socket path the system takes: `sun_path` less its terminating NUL (108
/// bytes on Linux, 104 on the BSDs and macOS).
const MAX_UNIX_PATH: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

/// Why a query parameter is refused, on a Sentinel URL, on a Unix socket URL, on another.
const UNKNOWN_SENTINEL_PARAM: &str = "unknown query parameter: a Sentinel URL takes db, wait, \
     waitaof, sentinel_user and sentinel_password";
const UNKNOWN_UNIX_PARAM: &str =
    "unknown query parameter: a Unix socket URL takes db, wait, waitaof, user and pass";
const UNKNOWN_PARAM: &str = "unknown query parameter: only ?db=N, ?wait=N and ?waitaof=L,R are \
     read (credentials go before the host)";

/// Why a `?waitaof=` value is refused.
const WAITAOF_RANGE: &str = "waitaof=L,R takes L = 0 or 1 (the master's own fsync) and R = 0 \
     to 16 replicas, not both 0";

/// `L,R` of `?waitaof=L,R`: `L` 0 or 1, `R` 0 to [`MAX_WAIT`], not both 0.
fn parse_waitaof(value: &str) -> Option<(u32, u32)> {
    let (l, r) = value.split_once(',')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(l) || !digits(r) {
        return None;
    }
    let (l, r) = (l.parse::<u32>().ok()?, r.parse::<u32>().ok()?);
    (l <= 1 && r <= MAX_WAIT && l + r > 0).then_some((l, r))
}

fn bad(url: &str, reason: &'static str) -> InvalidArgument {
    InvalidArgument::BadUrl {
        url: redact(url),
        reason,
    }
}

/// The parts of a URL, split as [`NodeAddr::parse`] splits them, before any check.
struct Parts<'a> {
    /// The scheme, when the URL has one (`redis` in `redis://...`).
    scheme: Option<&'a str>,
    /// What comes before the last `@` of the authority.
    userinfo: Option<&'a str>,
    /// `host`, `host:port`, `[v6]:port`; empty for `unix:///path`.
    hostport: &'a str,
    /// What follows the first `/` after the authority, without the query.
    path: &'a str,
    /// What follows the first `?`, if there is one.
    query: Option<&'a str>,
}

fn split(url: &str) -> Parts<'_> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    Parts {
        scheme,
        userinfo,
        hostport,
        path,
        query,
    }
}

/// The query parameters that hold a password.
fn is_password_param(name: &str) -> bool {
    matches!(name, "pass" | "password" | "sentinel_password")
}

/// `url` with its password replaced by `***`, for messages: split as the parser splits it,
/// so this holds for URLs the parser refuses too. A password in the query (`?pass=`) is
/// hidden too.
pub(crate) fn redact(url: &str) -> String {
    let parts = split(url.trim());
    let query_secret = parts.query.is_some_and(|q| {
        q.split('&')
            .any(|kv| is_password_param(kv.split_once('=').map_or(kv, |(k, _)| k)))
    });
    if parts.userinfo.is_none() && !query_secret {
        return url.to_owned();
    }
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = parts.scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    if let Some(userinfo) = parts.userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            // A lone userinfo is a password.
            None => out.push_str("***"),
        }
        out.push('@');
    }
    out.push_str(parts.hostport);
    let before_query = url.trim_end().split('?').next().unwrap_or("");
    if !parts.path.is_empty() || before_query.ends_with('/') {
        out.push('/');
        out.push_str(parts.path);
    }
    if let Some(query) = parts.query {
        out.push('?');
        for (i, kv) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match kv.split_once('=') {
                Some((k, _)) if is_password_param(k) => {
                    out.push_str(k);
                    out.push_str("=***");
                }
                _ => out.push_str(kv),
            }
        }
    }
    out
}

/// What a URL's scheme asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// A bare `host:port`.
    Bare,
    Redis,
    RedisTls,
    Unix,
    /// `redis+cluster://` (`tls`: `rediss+cluster://`).
    Cluster {
        tls: bool,
    },
    /// `redis+sentinel://` (`tls`: `rediss+sentinel://`).
    Sentinel {
        tls: bool,
    },
}

/// The query parameters of a URL: `db` for every scheme, and for Unix sockets (whose URL has
/// no place for credentials) `user` and `pass` as redis-rs reads them.
#[derive(Default)]
struct Query {
    db: Option<u32>,
    user: Option<Vec<u8>>,
    password: Option<Vec<u8>>,
    /// `?wait=N`, any scheme.
    wait: Option<u32>,
    /// `?waitaof=L,R`, any scheme.
    waitaof: Option<(u32, u32)>,
    /// `?sentinel_user=U&sentinel_password=P`, on a Sentinel URL only.
    sentinel_user: Option<Vec<u8>>,
    sentinel_password: Option<Vec<u8>>,
}

/// Which query parameters a URL takes beyond `db` and `wait`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// Nothing more (`redis://`, `rediss://`).
    Plain,
    /// `user` and `pass`: a Unix socket URL has no place for credentials.
    Unix,
    /// `sentinel_user` and `sentinel_password`.
    Sentinel,
}

fn parse_query(url: &str, query: &str, takes: Takes) -> Result<Query, InvalidArgument> {
    let unix = takes == Takes::Unix;
    let sentinel = takes == Takes::Sentinel;
    let mut q = Query::default();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (name, value) = kv
            .split_once('=')
            .ok_or_else(|| bad(url, "a query parameter needs a value (?db=N)"))?;
        let value = percent_decode(value).ok_or_else(|| bad(url, "bad %-escape"))?;
        let seen = match name {
            "db" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|s| s.parse::<u32>().ok())
                    .ok_or_else(|| bad(url, "bad database number"))?;
                q.db.replace(n).is_some()
            }
            "wait" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|s| s.parse::<u32>().ok())
                    .filter(|&n| (1..=MAX_WAIT).contains(&n))
                    .ok_or_else(|| bad(url, "wait=N takes 1 to 16 replicas"))?;
                q.wait.replace(n).is_some()
            }
            "waitaof" => {
                let la = std::str::from_utf8(&value).ok().and_then(parse_waitaof);
                let la = la.ok_or_else(|| bad(url, WAITAOF_RANGE))?;
                q.waitaof.replace(la).is_some()
            }
            "sentinel_user" if sentinel => q.sentinel_user.replace(value).is_some(),
            "sentinel_password" if sentinel => q.sentinel_password.replace(value).is_some(),
            _ if sentinel => return Err(bad(url, UNKNOWN_SENTINEL_PARAM)),
            "user" | "username" if unix => q.user.replace(value).is_some(),
            n if unix && is_password_param(n) => q.password.replace(value).is_some(),
            _ if unix => return Err(bad(url, UNKNOWN_UNIX_PARAM)),
            _ => return Err(bad(url, UNKNOWN_PARAM)),
        };
        if seen {
            return Err(bad(url, "a query parameter is given twice"));
        }
    }
    Ok(q)
}

impl NodeAddr {
    /// Parses and resolves one node URL. Resolution happens once, here, so that no lock operation
    /// ever blocks on DNS.
    pub fn parse(url: &str) -> Result<NodeAddr, InvalidArgument> {
        let url_trim = url.trim();
        if url_trim.is_empty() {
            return Err(bad(url, "empty"));
        }
        let Parts {
            scheme,
            userinfo,
            hostport,
            path,
            query,
        } = split(url_trim);
        let scheme = match scheme {
            None => Scheme::Bare,
            Some(s) if s.eq_ignore_ascii_case("redis") => Scheme::Redis,
            Some(s) if s.eq_ignore_ascii_case("rediss") => Scheme::RedisTls,
            Some(s) if s.eq_ignore_ascii_case("unix") || s.eq_ignore_ascii_case("redis+unix") => {
                Scheme::Unix
            }
            Some(s) if s.eq_ignore_ascii_case("redis+cluster") => Scheme::Cluster { tls: false },
            Some(s) if s.eq_ignore_ascii_case("rediss+cluster") => Scheme::Cluster { tls: true },
            Some(s) if s.eq_ignore_ascii_case("redis+sentinel") => Scheme::Sentinel { tls: false },
            Some(s) if s.eq_ignore_ascii_case("rediss+sentinel") => Scheme::Sentinel { tls: true },
            Some(_) => return Err(bad(url, SCHEMES)),
        };
        if scheme == (Scheme::Sentinel { tls: true }) && !cfg!(feature = "tls") {
            return Err(bad(
                url,
                "rediss+sentinel:// (TLS) needs redlock-mux built with its `tls` feature",
            ));
        }
        if scheme == (Scheme::Cluster { tls: true }) && !cfg!(feature = "tls") {
            return Err(bad(
                url,
                "rediss+cluster:// (TLS) needs redlock-mux built with its `tls` feature",
            ));
        }
        if scheme == Scheme::RedisTls && !cfg!(feature = "tls") {
            return Err(bad(
                url,
                "rediss:// (TLS) needs redlock-mux built with its `tls` feature",
            ));
        }
        if scheme == Scheme::Bare && (userinfo.is_some() || query.is_some()) {
            return Err(bad(
                url,
                "credentials and a query need the redis:// form (or rediss://, unix://)",
            ));
        }
        if scheme == Scheme::Unix {
            return Self::parse_unix(url, userinfo, hostport, path, query);
        }
        let (user, password) = match userinfo {
            None => (None, None),
            Some(ui) => match ui.split_once(':') {
                Some((u, p)) => {
                    let u = percent_decode(u).ok_or_else(|| bad(url, "bad %-escape"))?;
                    let p = percent_decode(p).ok_or_else(|| bad(url, "bad %-escape"))?;
                    ((!u.is_empty()).then_some(u), Some(p))
                }
                // A lone userinfo is a password, as redis-cli and most clients read it.
                None => (
                    None,
                    Some(percent_decode(ui).ok_or_else(|| bad(url, "bad %-escape"))?),
                ),
            },
        };
        if password.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(bad(url, "empty password"));
        }
        if let Scheme::Cluster { tls } = scheme {
            return Self::parse_cluster(url, tls, user, password, hostport, path, query);
        }
        if let Scheme::Sentinel { tls } = scheme {
            return Self::parse_sentinel(url, tls, user, password, hostport, path, query);
        }
        let (host, port) = split_host_port(hostport).ok_or_else(|| bad(url, "bad host:port"))?;
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad(url, "bad port"))?,
            None if scheme != Scheme::Bare => DEFAULT_PORT,
            None => return Err(bad(url, "missing port")),
        };
        if port == 0 {
            return Err(bad(url, "port 0"));
        }
        if scheme == Scheme::Bare && !path.is_empty() {
            return Err(bad(url, "a database needs the redis:// form"));
        }
        let path_db = match path {
            "" => None,
            p => Some(
                p.parse::<u32>()
                    .map_err(|_| bad(url, "bad database number"))?,
            ),
        };
        let q = match query {
            Some(q) => parse_query(url, q, Takes::Plain)?,
            None => Query::default(),
        };
        let db = match (path_db, q.db) {
            (Some(_), Some(_)) => {
                return Err(bad(url, "the database is given twice (/db and ?db=)"))
            }
            (a, b) => a.or(b).unwrap_or(0),
        };
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for addr in (host, port)
            .to_socket_addrs()
            .map_err(|_| bad(url, "host does not resolve"))?
        {
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if addrs.is_empty() {
            return Err(bad(url, "host does not resolve"));
        }
        Ok(NodeAddr {
            display: if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            },
            host: host.to_owned(),
            addrs,
            seed_hosts: Vec::new(),
            unix: None,
            tls: scheme == Scheme::RedisTls,
            user,
            password,
            db,
            cluster: false,
            wait: q.wait.unwrap_or(0),
            waitaof: q.waitaof,
            sentinel: None,
            role: false,
        })
    }

    /// `redis+cluster://[user:password@]host:port[,host:port…]`, split by [`split`], with its
    /// credentials read: every seed resolved, in order. A cluster has database 0 only, so the
    /// URL takes neither a path nor a query.
    fn parse_cluster(
        url: &str,
        tls: bool,
        user: Option<Vec<u8>>,
        password: Option<Vec<u8>>,
        hostport: &str,
        path: &str,
        query: Option<&str>,
    ) -> Result<NodeAddr, InvalidArgument> {
        if !path.is_empty() {
            return Err(bad(
                url,
                "a cluster URL takes no database: a Redis Cluster has database 0 only",
            ));
        }
        let mut wait = 0;
        let mut waitaof = None;
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("wait", n)) => {
                    wait = n
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| (1..=MAX_WAIT).contains(&n))
                        .ok_or_else(|| bad(url, "wait=N takes 1 to 16 replicas"))?
                }
                Some(("waitaof", la)) => {
                    waitaof = Some(parse_waitaof(la).ok_or_else(|| bad(url, WAITAOF_RANGE))?)
                }
                _ => {
                    return Err(bad(
                        url,
                        "a cluster URL takes only ?wait=N and ?waitaof=L,R (what a grant \
                         must reach); a Redis Cluster has database 0 only",
                    ))
                }
            }
        }
        let mut addrs: Vec<SocketAddr> = Vec::new();
        let mut seed_hosts: Vec<String> = Vec::new();
        let mut first_host = None;
        let mut display = String::new();
        let seeds = HostList {
            default_port: DEFAULT_PORT,
            bad_host: "bad host:port among the seeds",
            unresolved: "a seed host does not resolve",
        };
        seeds.each(url, hostport, &mut |host, shown, resolved| {
            for addr in resolved {
                if !addrs.contains(&addr) {
                    addrs.push(addr);
                    seed_hosts.push(host.to_owned());
                }
            }
            first_host.get_or_insert(host);
            if !display.is_empty() {
                display.push(',');
            }
            display.push_str(&shown);
            Ok(())
        })?;
        if addrs.is_empty() {
            return Err(bad(url, "a seed host does not resolve"));
        }
        Ok(NodeAddr {
            display,
            host: first_host.unwrap_or_default().to_owned(),
            addrs,
            seed_hosts,
            unix: None,
            tls,
            user,
            password,
            db: 0,
            cluster: true,
            wait,
            waitaof,
            sentinel: None,
            role: false,
        })
    }

    /// One master of the cluster this node is (`self.cluster`), at `addr`: reached with the
    /// cluster's credentials and TLS. TLS checks it against the name of the URL's seed at that
    /// address if there is one, else against its IP, the name the cluster gives it (until a
    /// topology read names its host: see `Endpoint::read_topology`).
    pub fn master(&self, addr: SocketAddr) -> NodeAddr {
        let host = match self.addrs.iter().position(|&a| a == addr) {
            Some(i) => self.tls_name(i).to_owned(),
            None => addr.ip().to_string(),
        };
        NodeAddr {
            display: addr.to_string(),
            host,
            addrs: vec![addr],
            seed_hosts: Vec::new(),
            unix: None,
            tls: self.tls,
            user: self.user.clone(),
            password: self.password.clone(),
            db: 0,
            cluster: false,
            wait: 0,
            waitaof: None,
            sentinel: None,
            role: false,
        }
    }

    /// `redis+sentinel://[user:password@]host:port[,host:port…]/SERVICE[?db=N&wait=N&sentinel_user=U&sentinel_password=P]`,
    /// split by [`split`], with the data nodes' credentials read: every sentinel resolved, in
    /// order. The credentials before the hosts are the master's; the sentinels' own are in
    /// the query (sentinels often have none).
    fn parse_sentinel(
        url: &str,
        tls: bool,
        user: Option<Vec<u8>>,
        password: Option<Vec<u8>>,
        hostport: &str,
        path: &str,
        query: Option<&str>,
    ) -> Result<NodeAddr, InvalidArgument> {
        let service = percent_decode(path.strip_suffix('/').unwrap_or(path))
            .and_then(|s| String::from_utf8(s).ok())
            .ok_or_else(|| bad(url, "bad %-escape in the service name"))?;
        if service.is_empty() {
            return Err(bad(
                url,
                "a Sentinel URL names its service: redis+sentinel://host:port/SERVICE",
            ));
        }
        if service.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control()) {
            return Err(bad(url, "bad service name"));
        }
        let q = match query {
            Some(q) => parse_query(url, q, Takes::Sentinel)?,
            None => Query::default(),
        };
        if q.sentinel_password.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(bad(url, "empty sentinel_password"));
        }
        if q.sentinel_user.is_some() && q.sentinel_password.is_none() {
            return Err(bad(
                url,
                "a sentinel_user needs a sentinel_password (?sentinel_user=U&sentinel_password=P)",
            ));
        }
        let mut sentinels: Vec<NodeAddr> = Vec::new();
        let mut addrs: Vec<SocketAddr> = Vec::new();
        let mut display = String::new();
        let list = HostList {
            default_port: DEFAULT_SENTINEL_PORT,
            bad_host: "bad host:port among the sentinels",
            unresolved: "a sentinel host does not resolve",
        };
        list.each(url, hostport, &mut |host, shown, resolved| {
            if resolved.is_empty() {
                return Err(bad(url, list.unresolved));
            }
            if sentinels.iter().any(|s| s.display == shown) {
                return Err(bad(url, "a sentinel is named twice"));
            }
            for a in &resolved {
                if !addrs.contains(a) {
                    addrs.push(*a);
                }
            }
            if !display.is_empty() {
                display.push(',');
            }
            display.push_str(&shown);
            sentinels.push(NodeAddr {
                display: shown,
                host: host.to_owned(),
                addrs: resolved,
                seed_hosts: Vec::new(),
                unix: None,
                tls,
                user: q.sentinel_user.clone(),
                password: q.sentinel_password.clone(),
                db: 0,
                cluster: false,
                wait: 0,
                waitaof: None,
                sentinel: None,
                role: false,
            });
            Ok(())
        })?;
        Ok(NodeAddr {
            display,
            host: sentinels[0].host.clone(),
            addrs,
            seed_hosts: Vec::new(),
            unix: None,
            tls,
            user,
            password,
            db: q.db.unwrap_or(0),
            cluster: false,
            wait: q.wait.unwrap_or(0),
            waitaof: q.waitaof,
            sentinel: Some(Box::new(SentinelSpec { service, sentinels })),
            role: false,
        })
    }

    /// The master a Sentinel member's sentinels named, at `addr` (`host` as they gave it, the
    /// name TLS checks): reached with the member's credentials, database, TLS and `wait`, and
    /// checked with `ROLE` in its setup.
    pub fn sentinel_master(&self, addr: SocketAddr, host: &str) -> NodeAddr {
        NodeAddr {
            display: addr.to_string(),
            host: host.to_owned(),
            addrs: vec![addr],
            seed_hosts: Vec::new(),
            unix: None,
            tls: self.tls,
            user: self.user.clone(),
            password: self.password.clone(),
            db: self.db,
            cluster: false,
            wait: self.wait,
            waitaof: self.waitaof,
            sentinel: None,
            role: true,
        }
    }

    /// `unix:///path/to/redis.sock[?db=N&user=U&pass=P]`, split by [`split`].
    fn parse_unix(
        url: &str,
        userinfo: Option<&str>,
        hostport: &str,
        path: &str,
        query: Option<&str>,
    ) -> Result<NodeAddr, InvalidArgument> {
        if userinfo.is_some() || !hostport.is_empty() {
            return Err(bad(
                url,
                "a Unix socket URL is unix:///absolute/path (credentials go in ?user=&pass=)",
            ));
        }
        if path.is_empty() {
            return Err(bad(url, "no socket path: write unix:///path/to/redis.sock"));
        }
        let decoded = percent_decode(path).ok_or_else(|| bad(url, "bad %-escape"))?;
        let decoded =
            String::from_utf8(decoded).map_err(|_| bad(url, "the socket path is not UTF-8"))?;
        let path = PathBuf::from(format!("/{decoded}"));
        if path.as_os_str().len() > MAX_UNIX_PATH {
            // No connect could ever take it (`sun_path` is that long, with its NUL).
            return Err(bad(
                url,
                "the socket path is too long for the system (at most 107 bytes on Linux, 103 \
                 elsewhere)",
            ));
        }
        let q = match query {
            Some(q) => parse_query(url, q, Takes::Unix)?,
            None => Query::default(),
        };
        if q.password.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(bad(url, "empty password"));
        }
        if q.user.is_some() && q.password.is_none() {
            return Err(bad(url, "a user needs a password (?user=U&pass=P)"));
        }
        Ok(NodeAddr {
            display: path.display().to_string(),
            host: String::new(),
            addrs: Vec::new(),
            seed_hosts: Vec::new(),
            unix: Some(path),
            tls: false,
            user: q.user,
            password: q.password,
            db: q.db.unwrap_or(0),
            cluster: false,
            wait: q.wait.unwrap_or(0),
            waitaof: q.waitaof,
            sentinel: None,
            role: false,
        })
    }

    /// The name TLS checks the certificate against on a connect to the `i`-th address: the
    /// host of the cluster seed it came from, else the URL's host.
    pub fn tls_name(&self, i: usize) -> &str {
        self.seed_hosts.get(i).map_or(&self.host, |h| h)
    }

    /// How many addresses a connect may try in turn.
    pub fn targets(&self) -> usize {
        if self.unix.is_some() {
            1
        } else {
            self.addrs.len()
        }
    }

    /// The `i`-th address to try (the last one past the end).
    pub fn target(&self, i: usize) -> Target<'_> {
        match &self.unix {
            Some(path) => Target::Unix(path),
            None => Target::Tcp(self.addrs[i.min(self.addrs.len() - 1)]),
        }
    }

    /// Whether the two may be one server: they share an address, or name one socket.
    pub fn shares_address(&self, other: &NodeAddr) -> bool {
        // Sentinels may watch several services, each its own master: two Sentinel members
        // are one only for the same service. A master named by sentinels and a node named
        // directly are told apart by their servers' `run_id` once connected.
        match (&self.sentinel, &other.sentinel) {
            (Some(a), Some(b)) => {
                return a.service == b.service && self.addrs.iter().any(|x| other.addrs.contains(x))
            }
            (None, None) => {}
            _ => return false,
        }
        match (&self.unix, &other.unix) {
            (Some(a), Some(b)) => a == b || same_file(a, b),
            (None, None) => self.addrs.iter().any(|a| other.addrs.contains(a)),
            _ => false,
        }
    }

    /// `host:port` as written and, when the host is a name, the addresses a connect tried
    /// (all of them, in turn): for the message of a failed connect.
    pub fn tried(&self) -> String {
        match &self.addrs[..] {
            [] => self.display.clone(),
            [one] if one.to_string() == self.display => self.display.clone(),
            addrs => {
                let mut out = format!("{}, tried ", self.display);
                for (i, a) in addrs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&a.to_string());
                }
                out
            }
        }
    }
}

/// Whether two socket paths name one file (through links, `..`, or another spelling), as far
/// as the file system says now; sockets that do not exist yet compare by path alone.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A node URL as the client reads it, parsed and resolved: `redis://[user:password@]host:port[/db]`,
/// `rediss://…` for TLS, bare `host:port`, or a Unix socket as `unix:///path/to/redis.sock`
/// (or `redis+unix:///…`), with `?db=N` (and, for a Unix socket, `&user=U&pass=P`) and
/// `%`-escapes in the user and password.
///
/// For tools that talk to the nodes a client uses (such as `redlock-mux inspect`), so that
/// they read URLs as the client does. Its `Display` and `Debug` never show the password:
/// `redis://user:***@host:port/db`.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeUrl(NodeAddr);

impl NodeUrl {
    /// Parses and resolves `url`, as [`ClientBuilder::nodes`](crate::ClientBuilder::nodes)
    /// does; a refusal is [`InvalidArgument::BadUrl`], whose URL has its password hidden.
    pub fn parse(url: &str) -> Result<NodeUrl, InvalidArgument> {
        NodeAddr::parse(url).map(NodeUrl)
    }

    /// The first address the host resolved to, with the port; see [`addrs`](Self::addrs).
    /// `None` for a Unix socket.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.0.addrs.first().copied()
    }

    /// Every address the host resolved to, with the port, in the resolver's order (as
    /// `getaddrinfo` sorts them); empty for a Unix socket. The client tries each in turn until
    /// one accepts the connection, as `redis-cli` does: `localhost` often resolves to `::1`
    /// before `127.0.0.1`, and a server bound to one of them refuses connections on the other.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.0.addrs
    }

    /// The host as written (an IPv6 address without its brackets): the name a TLS connection
    /// checks the server's certificate against. Empty for a Unix socket.
    pub fn host(&self) -> &str {
        &self.0.host
    }

    /// The Unix socket's path, for a `unix://` (or `redis+unix://`) URL.
    pub fn unix_path(&self) -> Option<&Path> {
        self.0.unix.as_deref()
    }

    /// Whether the URL is `rediss://`: the connection is TLS.
    pub fn is_tls(&self) -> bool {
        self.0.tls
    }

    /// The user to authenticate as, if any (`AUTH user password`).
    pub fn user(&self) -> Option<&[u8]> {
        self.0.user.as_deref()
    }

    /// The password, if any (`AUTH [user] password`).
    pub fn password(&self) -> Option<&[u8]> {
        self.0.password.as_deref()
    }

    /// The database number (`SELECT db`); 0 unless given.
    pub fn db(&self) -> u32 {
        self.0.db
    }

    /// Whether the URL is `redis+cluster://` (or `rediss+cluster://`): a Redis Cluster whose
    /// seeds are [`addrs`](Self::addrs).
    pub fn is_cluster(&self) -> bool {
        self.0.cluster
    }

    /// For a `redis+sentinel://` (or `rediss+sentinel://`) URL: the service whose master is
    /// the node, as its sentinels name it (the sentinels' addresses are
    /// [`addrs`](Self::addrs)).
    pub fn sentinel_service(&self) -> Option<&str> {
        self.0.sentinel.as_ref().map(|s| s.service.as_str())
    }

    /// `?wait=N`: how many replicas a grant must reach before it counts (0: none).
    pub fn wait(&self) -> u32 {
        self.0.wait
    }

    /// `?waitaof=L,R`: the master's own fsync (`L`, 0 or 1) and how many replicas' (`R`) a
    /// grant must reach before it counts; `None` when not asked.
    pub fn waitaof(&self) -> Option<(u32, u32)> {
        self.0.waitaof
    }

    /// For a `redis+cluster://` URL: the cluster's master at `addr` (one a `MOVED` names),
    /// reached with the URL's credentials and TLS, as the client reaches it. `None` for
    /// another URL.
    pub fn cluster_master(&self, addr: SocketAddr) -> Option<NodeUrl> {
        self.0.cluster.then(|| NodeUrl(self.0.master(addr)))
    }

    /// For a `redis+sentinel://` URL: each sentinel, in the URL's order, as a URL with the
    /// sentinels' credentials (`sentinel_user`, `sentinel_password`). Empty otherwise.
    pub fn sentinels(&self) -> Vec<NodeUrl> {
        self.0
            .sentinel
            .as_ref()
            .map(|s| s.sentinels.iter().cloned().map(NodeUrl).collect())
            .unwrap_or_default()
    }

    /// For a `redis+sentinel://` URL: the master its sentinels named at `addr` (`host` as they
    /// gave it, the name TLS checks), reached with the URL's credentials, database and TLS,
    /// as the client reaches it. `None` for another URL.
    pub fn sentinel_master(&self, addr: SocketAddr, host: &str) -> Option<NodeUrl> {
        self.0.sentinel.as_ref()?;
        Some(NodeUrl(self.0.sentinel_master(addr, host)))
    }
}

impl fmt::Display for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = &self.0;
        if n.unix.is_some() {
            write!(f, "unix://{}", n.display)?;
            let mut sep = '?';
            let mut param = |f: &mut fmt::Formatter<'_>, text: String| {
                let r = write!(f, "{sep}{text}");
                sep = '&';
                r
            };
            if n.db != 0 {
                param(f, format!("db={}", n.db))?;
            }
            if let Some(user) = &n.user {
                param(f, format!("user={}", String::from_utf8_lossy(user)))?;
            }
            if n.password.is_some() {
                param(f, "pass=***".to_owned())?;
            }
            if n.wait != 0 {
                param(f, format!("wait={}", n.wait))?;
            }
            if let Some((l, r)) = n.waitaof {
                param(f, format!("waitaof={l},{r}"))?;
            }
            return Ok(());
        }
        if let Some(s) = &n.sentinel {
            f.write_str(if n.tls {
                "rediss+sentinel://"
            } else {
                "redis+sentinel://"
            })?;
            match (&n.user, &n.password) {
                (Some(user), Some(_)) => write!(f, "{}:***@", String::from_utf8_lossy(user))?,
                (None, Some(_)) => f.write_str(":***@")?,
                _ => {}
            }
            write!(f, "{}/{}", n.display, s.service)?;
            let mut sep = '?';
            let mut param = |f: &mut fmt::Formatter<'_>, text: String| {
                let r = write!(f, "{sep}{text}");
                sep = '&';
                r
            };
            if n.db != 0 {
                param(f, format!("db={}", n.db))?;
            }
            if n.wait != 0 {
                param(f, format!("wait={}", n.wait))?;
            }
            if let Some((l, r)) = n.waitaof {
                param(f, format!("waitaof={l},{r}"))?;
            }
            let first = s.sentinels.first();
            if let Some(user) = first.and_then(|x| x.user.as_ref()) {
                param(
                    f,
                    format!("sentinel_user={}", String::from_utf8_lossy(user)),
                )?;
            }
            if first.is_some_and(|x| x.password.is_some()) {
                param(f, "sentinel_password=***".to_owned())?;
            }
            return Ok(());
        }
        f.write_str(match (n.tls, n.cluster) {
            (false, false) => "redis://",
            (true, false) => "rediss://",
            (false, true) => "redis+cluster://",
            (true, true) => "rediss+cluster://",
        })?;
        match (&n.user, &n.password) {
            (Some(user), Some(_)) => write!(f, "{}:***@", String::from_utf8_lossy(user))?,
            (None, Some(_)) => f.write_str(":***@")?,
            _ => {}
        }
        f.write_str(&n.display)?;
        if n.db != 0 {
            write!(f, "/{}", n.db)?;
        }
        let mut sep = '?';
        if n.wait != 0 {
            write!(f, "{sep}wait={}", n.wait)?;
            sep = '&';
        }
        if let Some((l, r)) = n.waitaof {
            write!(f, "{sep}waitaof={l},{r}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeUrl({self})")
    }
}

/// A comma-separated host list in a URL: a cluster's seeds or a Sentinel member's sentinels,
/// with the port a host without one gets and what an error says of a host.
struct HostList {
    default_port: u16,
    /// A host that is not `host`, `host:port`, `[v6]` or `[v6]:port`.
    bad_host: &'static str,
    /// A host whose name does not resolve.
    unresolved: &'static str,
}

impl HostList {
    /// Reads `hostport`'s hosts in order, each resolved, and hands `each` the host as written,
    /// how it is shown (`host:port`, `[v6]:port`) and its addresses (each once, possibly none);
    /// the first error, from reading a host or from `each`, ends the list. `each` is a trait
    /// object, so that both lists share one copy of this code (512 bytes of the small command).
    fn each<'a>(
        &self,
        url: &str,
        hostport: &'a str,
        each: &mut dyn FnMut(&'a str, String, Vec<SocketAddr>) -> Result<(), InvalidArgument>,
    ) -> Result<(), InvalidArgument> {
        for one in hostport.split(',') {
            let (host, port) = split_host_port(one).ok_or_else(|| bad(url, self.bad_host))?;
            let port = match port {
                Some(p) => p.parse::<u16>().map_err(|_| bad(url, "bad port"))?,
                None => self.default_port,
            };
            if port == 0 {
                return Err(bad(url, "port 0"));
            }
            let mut resolved: Vec<SocketAddr> = Vec::new();
            for addr in (host, port)
                .to_socket_addrs()
                .map_err(|_| bad(url, self.unresolved))?
            {
                if !resolved.contains(&addr) {
                    resolved.push(addr);
                }
            }
            let shown = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            each(host, shown, resolved)?;
        }
        Ok(())
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        if host.is_empty() {
            return None;
        }
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    if host.is_empty() || host.contains(':') || host.contains(|c: char| c.is_whitespace()) {
        return None;
    }
    Some((host, port))
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hi = (hex[0] as char).to_digit(16)?;
            let lo = (hex[1] as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port() {
        let n = NodeAddr::parse("127.0.0.1:7000").unwrap();
        assert_eq!(n.addrs, ["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!((n.user, n.password, n.db), (None, None, 0));
        assert_eq!(n.display, "127.0.0.1:7000");
    }

    #[test]
    fn full_url() {
        let n = NodeAddr::parse("redis://app:s%40cret@127.0.0.1:7001/3").unwrap();
        assert_eq!(n.user.as_deref(), Some(&b"app"[..]));
        assert_eq!(n.password.as_deref(), Some(&b"s@cret"[..]));
        assert_eq!(n.db, 3);
        let n = NodeAddr::parse("redis://:pw@127.0.0.1:7001").unwrap();
        assert_eq!((n.user, n.password.as_deref()), (None, Some(&b"pw"[..])));
        let n = NodeAddr::parse("redis://127.0.0.1").unwrap();
        assert_eq!(n.addrs[0].port(), 6379);
        let n = NodeAddr::parse("redis://[::1]:7002").unwrap();
        assert_eq!(n.addrs, ["[::1]:7002".parse().unwrap()]);
        assert_eq!(n.display, "[::1]:7002");
        assert_eq!(n.tried(), "[::1]:7002");
    }

    #[test]
    fn a_host_name_keeps_every_address_it_resolves_to() {
        // Whatever the resolver gives `localhost` here, it is all kept, in its order.
        let mut once: Vec<SocketAddr> = Vec::new();
        for a in ("localhost", 7003).to_socket_addrs().unwrap() {
            if !once.contains(&a) {
                once.push(a);
            }
        }
        let n = NodeAddr::parse("redis://localhost:7003").unwrap();
        assert!(!n.addrs.is_empty());
        assert_eq!(n.addrs, once);
        assert_eq!(NodeUrl::parse("localhost:7003").unwrap().addrs(), &once[..]);
        let tried = n.tried();
        assert!(tried.starts_with("localhost:7003, tried "), "{tried}");
        for a in &n.addrs {
            assert!(tried.contains(&a.to_string()), "{tried}");
        }
        let v4 = NodeAddr::parse("127.0.0.1:7003").unwrap();
        assert_eq!(
            n.shares_address(&v4),
            n.addrs.contains(&"127.0.0.1:7003".parse().unwrap())
        );
        assert!(!v4.shares_address(&NodeAddr::parse("127.0.0.1:7004").unwrap()));
    }

    #[test]
    fn passwords_are_never_shown() {
        let n = NodeUrl::parse("redis://app:s%40cret@127.0.0.1:7001/3").unwrap();
        assert_eq!(n.to_string(), "redis://app:***@127.0.0.1:7001/3");
        assert_eq!(
            format!("{n:?}"),
            "NodeUrl(redis://app:***@127.0.0.1:7001/3)"
        );
        assert_eq!(n.password(), Some(&b"s@cret"[..]));
        let n = NodeUrl::parse("redis://:pw@127.0.0.1:7001").unwrap();
        assert_eq!(n.to_string(), "redis://:***@127.0.0.1:7001");
        let n = NodeUrl::parse("127.0.0.1:7001").unwrap();
        assert_eq!(n.to_string(), "redis://127.0.0.1:7001");
        for (url, shown) in [
            (
                "redis://a:secret@127.0.0.1:1/x",
                "redis://a:***@127.0.0.1:1/x",
            ),
            ("redis://secret@h:1", "redis://***@h:1"),
            ("http://u:secret@h:1", "http://u:***@h:1"),
            ("u:secret@h:1", "u:***@h:1"),
            ("redis://h:1/2", "redis://h:1/2"),
        ] {
            assert_eq!(redact(url), shown);
        }
        match NodeAddr::parse("redis://:secret@127.0.0.1:99999").unwrap_err() {
            InvalidArgument::BadUrl { url, .. } => assert_eq!(url, "redis://:***@127.0.0.1:99999"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn unix_sockets() {
        for url in [
            "unix:///run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock",
            "UNIX:///run/redis/redis.sock",
        ] {
            let n = NodeAddr::parse(url).unwrap();
            assert_eq!(n.unix.as_deref(), Some(Path::new("/run/redis/redis.sock")));
            assert!(n.addrs.is_empty() && !n.tls);
            assert_eq!((&n.user, &n.password, n.db), (&None, &None, 0));
            assert_eq!(n.targets(), 1);
            assert_eq!(
                n.target(3),
                Target::Unix(Path::new("/run/redis/redis.sock"))
            );
        }
        let n = NodeAddr::parse("unix:///tmp/r%20s.sock?db=3&user=app&pass=s%40cret").unwrap();
        assert_eq!(n.unix.as_deref(), Some(Path::new("/tmp/r s.sock")));
        assert_eq!(n.db, 3);
        assert_eq!(n.user.as_deref(), Some(&b"app"[..]));
        assert_eq!(n.password.as_deref(), Some(&b"s@cret"[..]));
        let shown = NodeUrl::parse("redis+unix:///tmp/r.sock?pass=secret&db=2").unwrap();
        assert_eq!(shown.to_string(), "unix:///tmp/r.sock?db=2&pass=***");
        assert_eq!(shown.addr(), None);
        assert_eq!(shown.unix_path(), Some(Path::new("/tmp/r.sock")));
        assert_eq!(
            redact("unix:///tmp/r.sock?pass=secret&db=2"),
            "unix:///tmp/r.sock?pass=***&db=2"
        );
        let a = NodeAddr::parse("unix:///tmp/a.sock").unwrap();
        assert!(a.shares_address(&NodeAddr::parse("redis+unix:///tmp/a.sock?db=1").unwrap()));
        assert!(!a.shares_address(&NodeAddr::parse("unix:///tmp/b.sock").unwrap()));
        assert!(!a.shares_address(&NodeAddr::parse("127.0.0.1:6379").unwrap()));
        for url in [
            "unix://",
            "unix:///",
            "unix://host/tmp/a.sock",
            "unix://u:p@/tmp/a.sock",
            "unix:///tmp/a.sock?db=x",
            "unix:///tmp/a.sock?nodb=1",
            "unix:///tmp/a.sock?db=1&db=2",
            "unix:///tmp/a.sock?user=u",
            "unix:///tmp/a.sock?pass=",
            "unix:///tmp/a.sock?db",
        ] {
            let e = NodeAddr::parse(url).unwrap_err();
            assert!(
                matches!(e, InvalidArgument::BadUrl { .. }),
                "{url:?}: {e:?}"
            );
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }

    #[test]
    fn cluster_urls_name_the_seeds_of_one_cluster() {
        let n = NodeAddr::parse("redis+cluster://app:pw@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002")
            .unwrap();
        assert!(n.cluster && !n.tls);
        assert_eq!(
            n.addrs,
            [
                "127.0.0.1:7000".parse().unwrap(),
                "127.0.0.1:7001".parse().unwrap(),
                "[::1]:7002".parse().unwrap()
            ]
        );
        assert_eq!(n.display, "127.0.0.1:7000,127.0.0.1:7001,[::1]:7002");
        assert_eq!(n.host, "127.0.0.1");
        assert_eq!(n.user.as_deref(), Some(&b"app"[..]));
        assert_eq!(n.password.as_deref(), Some(&b"pw"[..]));
        let url = NodeUrl::parse("REDIS+CLUSTER://:pw@127.0.0.1:7000").unwrap();
        assert!(url.is_cluster());
        assert_eq!(url.to_string(), "redis+cluster://:***@127.0.0.1:7000");
        // The default port, as for redis://.
        let n = NodeAddr::parse("redis+cluster://127.0.0.1").unwrap();
        assert_eq!(n.addrs, ["127.0.0.1:6379".parse().unwrap()]);
        // A master reached from it keeps its credentials and its TLS name.
        let m = n.master("127.0.0.1:7005".parse().unwrap());
        assert!(!m.cluster && m.db == 0 && m.host == "127.0.0.1");
        let n = NodeAddr::parse("redis+cluster://127.0.0.1:7000?wait=1").unwrap();
        assert_eq!((n.cluster, n.wait), (true, 1));
        assert_eq!(
            NodeUrl(n).to_string(),
            "redis+cluster://127.0.0.1:7000?wait=1"
        );
        for (url, why) in [
            ("redis+cluster://127.0.0.1:7000/1", "database"),
            ("redis+cluster://127.0.0.1:7000?db=1", "database"),
            ("redis+cluster://127.0.0.1:7000?wait=0", "wait"),
            ("redis+cluster://127.0.0.1:7000?wait=17", "wait"),
            (
                "redis+cluster://127.0.0.1:7000,,127.0.0.1:7001",
                "host:port",
            ),
            ("redis+cluster://127.0.0.1:0", "port 0"),
            ("redis+cluster://127.0.0.1:x", "bad port"),
            ("redis+cluster://:@127.0.0.1:7000", "empty password"),
        ] {
            match NodeAddr::parse(url) {
                Err(InvalidArgument::BadUrl { reason, .. }) => {
                    assert!(reason.contains(why), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        #[cfg(not(feature = "tls"))]
        assert!(NodeAddr::parse("rediss+cluster://127.0.0.1:7000").is_err());
    }

    /// The seeds of a cluster and the sentinels of a Sentinel member are read by one parser:
    /// each list's own errors, the first error in the list's order, the default port, how the
    /// hosts are shown, and every address once.
    #[test]
    fn host_lists_read_alike() {
        let reason = |url: &str| match NodeAddr::parse(url) {
            Err(InvalidArgument::BadUrl { reason, .. }) => reason,
            other => panic!("{url}: {other:?}"),
        };
        for (url, why) in [
            (
                "redis+cluster://127.0.0.1:1,[::1:2",
                "bad host:port among the seeds",
            ),
            ("redis+cluster://127.0.0.1:1,127.0.0.1:x", "bad port"),
            ("redis+cluster://127.0.0.1:0,127.0.0.1:x", "port 0"),
            ("redis+cluster://127.0.0.1:x,127.0.0.1:0", "bad port"),
            (
                "redis+cluster://127.0.0.1:1,no such host.invalid:2",
                "bad host:port among the seeds",
            ),
            (
                "redis+sentinel://127.0.0.1:1,[::1:2/m",
                "bad host:port among the sentinels",
            ),
            ("redis+sentinel://127.0.0.1:1,127.0.0.1:x/m", "bad port"),
            (
                "redis+sentinel://127.0.0.1:1,127.0.0.1:1,127.0.0.1:x/m",
                "a sentinel is named twice",
            ),
            (
                "redis+sentinel://127.0.0.1:0,127.0.0.1:1,127.0.0.1:1/m",
                "port 0",
            ),
        ] {
            assert_eq!(reason(url), why, "{url}");
        }
        let c = NodeAddr::parse("redis+cluster://127.0.0.1,[::1]:7001,127.0.0.1:6379").unwrap();
        assert_eq!(c.display, "127.0.0.1:6379,[::1]:7001,127.0.0.1:6379");
        assert_eq!(
            c.addrs,
            [
                "127.0.0.1:6379".parse().unwrap(),
                "[::1]:7001".parse().unwrap()
            ]
        );
        assert_eq!(c.seed_hosts, ["127.0.0.1", "::1"]);
        assert_eq!(c.host, "127.0.0.1");
        let s = NodeAddr::parse("redis+sentinel://127.0.0.1,[::1]:26380/m").unwrap();
        assert_eq!(s.display, "127.0.0.1:26379,[::1]:26380");
        assert_eq!(
            s.addrs,
            [
                "127.0.0.1:26379".parse().unwrap(),
                "[::1]:26380".parse().unwrap()
            ]
        );
        let sentinels = &s.sentinel.as_ref().unwrap().sentinels;
        assert_eq!(sentinels.len(), 2);
        assert_eq!(sentinels[1].display, "[::1]:26380");
        assert_eq!(sentinels[1].host, "::1");
        assert_eq!(s.host, "127.0.0.1");
    }

    #[test]
    fn schemes_and_queries() {
        let n = NodeAddr::parse("redis://127.0.0.1:7001?db=4").unwrap();
        assert_eq!(n.db, 4);
        let n = NodeAddr::parse("redis://127.0.0.1:7001/?db=5").unwrap();
        assert_eq!(n.db, 5);
        let n = NodeAddr::parse("REDIS://localhost").unwrap();
        assert_eq!((n.host.as_str(), n.addrs[0].port()), ("localhost", 6379));
        for (url, says) in [
            ("http://127.0.0.1:1", "redis://, rediss:// (TLS), unix://"),
            ("redis://127.0.0.1:1/2?db=3", "given twice"),
            ("redis://127.0.0.1:1?timeout=3", "only ?db=N"),
            ("redis://127.0.0.1:1?db=-1", "database"),
            ("127.0.0.1:1?db=1", "the redis:// form"),
        ] {
            let e = NodeAddr::parse(url).unwrap_err();
            assert!(e.to_string().contains(says), "{url:?}: {e}");
        }
        let tls = NodeAddr::parse("rediss://u:pw@127.0.0.1:6380/2");
        if cfg!(feature = "tls") {
            let n = tls.unwrap();
            assert!(n.tls);
            assert_eq!((n.host.as_str(), n.db), ("127.0.0.1", 2));
            let shown = NodeUrl::parse("rediss://u:pw@127.0.0.1:6380/2").unwrap();
            assert!(shown.is_tls());
            assert_eq!(shown.to_string(), "rediss://u:***@127.0.0.1:6380/2");
        } else {
            let e = tls.unwrap_err();
            assert!(e.to_string().contains("`tls` feature"), "{e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_service() {
        let n = NodeAddr::parse(
            "redis+sentinel://app:pw@127.0.0.1:26379,127.0.0.1:26380,[::1]/mymaster?db=2&wait=1\
             &sentinel_user=sen&sentinel_password=s%40cret",
        )
        .unwrap();
        let s = n.sentinel.as_deref().unwrap();
        assert_eq!(s.service, "mymaster");
        assert_eq!(s.sentinels.len(), 3);
        assert_eq!(s.sentinels[2].addrs, ["[::1]:26379".parse().unwrap()]);
        for one in &s.sentinels {
            assert_eq!(one.user.as_deref(), Some(&b"sen"[..]));
            assert_eq!(one.password.as_deref(), Some(&b"s@cret"[..]));
            assert_eq!((one.db, one.wait, one.role), (0, 0, false));
        }
        assert_eq!((n.db, n.wait, n.cluster, n.tls), (2, 1, false, false));
        assert_eq!(n.user.as_deref(), Some(&b"app"[..]));
        assert_eq!(n.password.as_deref(), Some(&b"pw"[..]));
        assert_eq!(n.addrs.len(), 3);
        // The master it finds keeps the member's credentials, database and wait, not the
        // sentinels'; its setup checks its role.
        let m = n.sentinel_master("127.0.0.1:6400".parse().unwrap(), "127.0.0.1");
        assert_eq!(m.user.as_deref(), Some(&b"app"[..]));
        assert_eq!(m.password.as_deref(), Some(&b"pw"[..]));
        assert_eq!((m.db, m.wait, m.role), (2, 1, true));
        assert!(m.sentinel.is_none());
        let shown = NodeUrl::parse(
            "redis+sentinel://app:pw@127.0.0.1:26379/mymaster?sentinel_password=secret&wait=2",
        )
        .unwrap();
        assert_eq!(shown.sentinel_service(), Some("mymaster"));
        assert_eq!(
            shown.to_string(),
            "redis+sentinel://app:***@127.0.0.1:26379/mymaster?wait=2&sentinel_password=***"
        );
        assert_eq!(
            redact("redis+sentinel://h:1/m?sentinel_password=secret"),
            "redis+sentinel://h:1/m?sentinel_password=***"
        );
        // Sentinels without credentials, the default port, a trailing slash.
        let n = NodeAddr::parse("REDIS+SENTINEL://127.0.0.1/svc/").unwrap();
        let s = n.sentinel.as_deref().unwrap();
        assert_eq!(s.service, "svc");
        assert_eq!(s.sentinels[0].addrs, ["127.0.0.1:26379".parse().unwrap()]);
        assert_eq!(
            (&s.sentinels[0].user, &s.sentinels[0].password),
            (&None, &None)
        );
        // Two services of the same sentinels are two members; one service twice is one.
        let a = NodeAddr::parse("redis+sentinel://127.0.0.1:26379/a").unwrap();
        let b = NodeAddr::parse("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/b").unwrap();
        let a2 = NodeAddr::parse("redis+sentinel://127.0.0.1:26380,127.0.0.1:26379/a").unwrap();
        assert!(!a.shares_address(&b) && a.shares_address(&a2));
        assert!(!a.shares_address(&NodeAddr::parse("127.0.0.1:26379").unwrap()));
        for (url, why) in [
            ("redis+sentinel://127.0.0.1:26379", "names its service"),
            ("redis+sentinel://127.0.0.1:26379/", "names its service"),
            ("redis+sentinel://127.0.0.1:26379/a/b", "bad service name"),
            ("redis+sentinel://127.0.0.1:26379/a%zz", "%-escape"),
            ("redis+sentinel://127.0.0.1:26379/m?wait=0", "wait"),
            ("redis+sentinel://127.0.0.1:26379/m?wait=x", "wait"),
            ("redis+sentinel://127.0.0.1:26379/m?db=x", "database"),
            (
                "redis+sentinel://127.0.0.1:26379/m?pass=x",
                "sentinel_password",
            ),
            (
                "redis+sentinel://127.0.0.1:26379/m?sentinel_user=u",
                "needs a sentinel_password",
            ),
            (
                "redis+sentinel://127.0.0.1:26379/m?sentinel_password=",
                "empty",
            ),
            ("redis+sentinel://127.0.0.1:26379/m?wait=1&wait=2", "twice"),
            ("redis+sentinel://127.0.0.1:1,,127.0.0.1:2/m", "host:port"),
            ("redis+sentinel://127.0.0.1:1,127.0.0.1:1/m", "named twice"),
            ("redis+sentinel://127.0.0.1:0/m", "port 0"),
            ("redis+sentinel://:@127.0.0.1:1/m", "empty password"),
            ("redis+sentinel://no such host.invalid:1/m", "host:port"),
        ] {
            match NodeAddr::parse(url) {
                Err(InvalidArgument::BadUrl { reason, .. }) => {
                    assert!(reason.contains(why), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let tls = NodeAddr::parse("rediss+sentinel://127.0.0.1:26379/m");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls"), "{tls:?}");
        if let Ok(n) = tls {
            assert!(n.tls && n.sentinel.unwrap().sentinels[0].tls);
        }
    }

    #[test]
    fn wait_is_read_on_every_scheme() {
        let n = NodeAddr::parse("redis://127.0.0.1:7001/2?wait=1").unwrap();
        assert_eq!((n.db, n.wait), (2, 1));
        assert_eq!(NodeUrl(n).to_string(), "redis://127.0.0.1:7001/2?wait=1");
        let n = NodeAddr::parse("unix:///tmp/r.sock?wait=2").unwrap();
        assert_eq!(n.wait, 2);
        assert_eq!(NodeUrl(n).to_string(), "unix:///tmp/r.sock?wait=2");
        assert_eq!(NodeAddr::parse("redis://127.0.0.1:7001").unwrap().wait, 0);
        for url in [
            "redis://127.0.0.1:7001?wait=0",
            "redis://127.0.0.1:7001?wait=17",
            "redis://127.0.0.1:7001?wait=",
            "unix:///tmp/r.sock?wait=-1",
        ] {
            let e = NodeAddr::parse(url).unwrap_err();
            assert!(e.to_string().contains("wait=N"), "{url}: {e}");
        }
    }

    #[test]
    fn waitaof_is_read_on_every_scheme() {
        let n = NodeAddr::parse("redis://127.0.0.1:7001?wait=1&waitaof=1,2").unwrap();
        assert_eq!((n.wait, n.waitaof), (1, Some((1, 2))));
        assert_eq!(
            NodeUrl(n).to_string(),
            "redis://127.0.0.1:7001?wait=1&waitaof=1,2"
        );
        let n = NodeAddr::parse("redis://127.0.0.1:7001?waitaof=0%2C1").unwrap();
        assert_eq!(n.waitaof, Some((0, 1)));
        assert_eq!(NodeUrl(n).to_string(), "redis://127.0.0.1:7001?waitaof=0,1");
        let n = NodeAddr::parse("unix:///tmp/r.sock?waitaof=1,0").unwrap();
        assert_eq!(n.waitaof, Some((1, 0)));
        let n = NodeAddr::parse("redis+cluster://127.0.0.1:7000?waitaof=1,1&wait=1").unwrap();
        assert_eq!((n.wait, n.waitaof), (1, Some((1, 1))));
        let n = NodeAddr::parse("redis+sentinel://127.0.0.1:26379/mymaster?waitaof=1,1").unwrap();
        assert_eq!(n.waitaof, Some((1, 1)));
        let addr = "127.0.0.1:6380".parse().unwrap();
        assert_eq!(n.sentinel_master(addr, "127.0.0.1").waitaof, Some((1, 1)));
        assert_eq!(
            NodeAddr::parse("redis://127.0.0.1:7001").unwrap().waitaof,
            None
        );
        for bad in [
            "", "1", "0,0", "2,0", "1,17", "-1,1", "1,+1", "a,b", "1,1,1", " 1,1",
        ] {
            for scheme in ["redis://127.0.0.1:7001", "redis+cluster://127.0.0.1:7000"] {
                let url = format!("{scheme}?waitaof={bad}");
                let e = NodeAddr::parse(&url).unwrap_err();
                assert!(e.to_string().contains("waitaof=L,R"), "{url}: {e}");
            }
        }
        let twice = NodeAddr::parse("redis://127.0.0.1:7001?waitaof=1,1&waitaof=1,1");
        assert!(twice.is_err());
    }

    #[test]
    fn rejects_malformed() {
        for url in [
            "",
            "   ",
            "http://127.0.0.1:1",
            "127.0.0.1",
            "127.0.0.1:",
            "127.0.0.1:99999",
            "127.0.0.1:0",
            "127.0.0.1:abc",
            "redis://127.0.0.1:1/x",
            "redis://127.0.0.1:1/-1",
            "redis://:@127.0.0.1:1",
            "redis://a:%zz@127.0.0.1:1",
            "user:pw@127.0.0.1:1",
            "127.0.0.1:1/2",
            "redis://[::1",
            "redis://[]:1",
            ":6379",
            "no such host.invalid:1",
        ] {
            let e = NodeAddr::parse(url).unwrap_err();
            assert!(
                matches!(e, InvalidArgument::BadUrl { .. }),
                "{url:?}: {e:?}"
            );
        }
    }
}
