//! Node URLs: `redis://[user:password@]host:port[/db]` and bare `host:port`.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::InvalidArgument;

/// The default Redis port, used when a `redis://` URL names none.
const DEFAULT_PORT: u16 = 6379;

/// One node, parsed and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAddr {
    /// `host:port` as written, for messages.
    pub display: String,
    /// Every address the host resolved to, in the resolver's order, each once; never empty.
    /// A connect tries them in turn until one takes it (`localhost` is often `::1` first,
    /// then `127.0.0.1`, and a server may listen on only one of them).
    pub addrs: Vec<SocketAddr>,
    pub user: Option<Vec<u8>>,
    pub password: Option<Vec<u8>>,
    pub db: u32,
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
    /// `host`, `host:port`, `[v6]:port`.
    hostport: &'a str,
    /// What follows the first `/` after the authority.
    path: &'a str,
}

fn split(url: &str) -> Parts<'_> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
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
    }
}

/// `url` with its password replaced by `***`, for messages: split as the parser splits it,
/// so this holds for URLs the parser refuses too.
pub(crate) fn redact(url: &str) -> String {
    let parts = split(url.trim());
    let Some(userinfo) = parts.userinfo else {
        return url.to_owned();
    };
    let hidden = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        // A lone userinfo is a password.
        None => "***".to_owned(),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = parts.scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&hidden);
    out.push('@');
    out.push_str(parts.hostport);
    if !parts.path.is_empty() || url.trim_end().ends_with('/') {
        out.push('/');
        out.push_str(parts.path);
    }
    out
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
        } = split(url_trim);
        let scheme = match scheme {
            Some("redis") => true,
            Some(_) => return Err(bad(url, "the scheme must be redis://")),
            None => false,
        };
        if userinfo.is_some() && !scheme {
            return Err(bad(url, "credentials need the redis:// form"));
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
        let (host, port) = split_host_port(hostport).ok_or_else(|| bad(url, "bad host:port"))?;
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad(url, "bad port"))?,
            None if scheme => DEFAULT_PORT,
            None => return Err(bad(url, "missing port")),
        };
        if port == 0 {
            return Err(bad(url, "port 0"));
        }
        let db = match path {
            "" => 0,
            p => p
                .parse::<u32>()
                .map_err(|_| bad(url, "bad database number"))?,
        };
        if !scheme && !path.is_empty() {
            return Err(bad(url, "a database needs the redis:// form"));
        }
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
            addrs,
            user,
            password,
            db,
        })
    }

    /// Whether the two may be one server: they share an address.
    pub fn shares_address(&self, other: &NodeAddr) -> bool {
        self.addrs.iter().any(|a| other.addrs.contains(a))
    }

    /// `host:port` as written and, when the host is a name, the addresses a connect tried
    /// (all of them, in turn): for the message of a failed connect.
    pub fn tried(&self) -> String {
        match &self.addrs[..] {
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

/// A node URL as the client reads it: `redis://[user:password@]host:port[/db]` or bare
/// `host:port`, with `%`-escapes in the user and password, parsed and resolved.
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
    pub fn addr(&self) -> SocketAddr {
        self.0.addrs[0]
    }

    /// Every address the host resolved to, with the port, in the resolver's order (as
    /// `getaddrinfo` sorts them). The client tries each in turn until one accepts the
    /// connection, as `redis-cli` does: `localhost` often resolves to `::1` before
    /// `127.0.0.1`, and a server bound to one of them refuses connections on the other.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.0.addrs
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
}

impl fmt::Display for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("redis://")?;
        match (&self.0.user, &self.0.password) {
            (Some(user), Some(_)) => write!(f, "{}:***@", String::from_utf8_lossy(user))?,
            (None, Some(_)) => f.write_str(":***@")?,
            _ => {}
        }
        f.write_str(&self.0.display)?;
        if self.0.db != 0 {
            write!(f, "/{}", self.0.db)?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeUrl({self})")
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
