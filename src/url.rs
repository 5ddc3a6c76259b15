//! Node URLs: `redis://[user:password@]host:port[/db]` and bare `host:port`.
#![forbid(unsafe_code)]

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::InvalidArgument;

/// The default Redis port, used when a `redis://` URL names none.
const DEFAULT_PORT: u16 = 6379;

/// One node, parsed and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAddr {
    /// `host:port` as written, for messages.
    pub display: String,
    pub addr: SocketAddr,
    pub user: Option<Vec<u8>>,
    pub password: Option<Vec<u8>>,
    pub db: u32,
}

fn bad(url: &str, reason: &'static str) -> InvalidArgument {
    InvalidArgument::BadUrl {
        url: url.to_owned(),
        reason,
    }
}

impl NodeAddr {
    /// Parses and resolves one node URL. Resolution happens once, here, so that no lock operation
    /// ever blocks on DNS.
    pub fn parse(url: &str) -> Result<NodeAddr, InvalidArgument> {
        let url_trim = url.trim();
        if url_trim.is_empty() {
            return Err(bad(url, "empty"));
        }
        let (rest, scheme) = match url_trim.split_once("://") {
            Some(("redis", rest)) => (rest, true),
            Some(_) => return Err(bad(url, "the scheme must be redis://")),
            None => (url_trim, false),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) if scheme => (Some(&authority[..i]), &authority[i + 1..]),
            Some(_) => return Err(bad(url, "credentials need the redis:// form")),
            None => (None, authority),
        };
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
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|_| bad(url, "host does not resolve"))?
            .next()
            .ok_or_else(|| bad(url, "host does not resolve"))?;
        Ok(NodeAddr {
            display: if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            },
            addr,
            user,
            password,
            db,
        })
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
        assert_eq!(n.addr, "127.0.0.1:7000".parse().unwrap());
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
        assert_eq!(n.addr.port(), 6379);
        let n = NodeAddr::parse("redis://[::1]:7002").unwrap();
        assert_eq!(n.addr, "[::1]:7002".parse().unwrap());
        assert_eq!(n.display, "[::1]:7002");
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
