//! A blocking connection to one node, for `inspect` and `bench`: one stream (TCP, a Unix
//! socket, or TLS with the `tls` feature), the library's URL parser and RESP codec, and
//! failures sorted by what they say about the node.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use redlock_mux::resp::{self, Limits, Status, Value};
use redlock_mux::NodeUrl;

use crate::args::TlsFiles;

/// Why a node could not be read.
#[derive(Debug)]
pub enum Failure {
    /// No connection, or no answer in time: the node may be down.
    Unreachable(io::Error),
    /// The node answered with an error: a wrong password or user, a database it does not
    /// have, missing permissions; or TLS refused the connection (a certificate that does not
    /// verify, a name that does not match).
    Refused(String),
    /// The node answered as no Redis server does.
    NotRedis(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Unreachable(e) => write!(f, "unreachable: {e}"),
            Failure::Refused(e) => write!(f, "refused: {e}"),
            Failure::NotRedis(e) => write!(f, "not a Redis server: {e}"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Unreachable(e)
    }
}

/// The stream under a connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// The stream to `url`, with `timeout` on every read and write.
fn open(url: &NodeUrl, tls: &TlsFiles, timeout: Duration) -> Result<Stream, Failure> {
    if let Some(path) = url.unix_path() {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        return Ok(Stream::Unix(s));
    }
    let stream = crate::raw::connect_first(url.addrs(), timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    if !url.is_tls() {
        return Ok(Stream::Tcp(stream));
    }
    #[cfg(feature = "tls")]
    {
        crate::tls::wrap(stream, url.host(), tls)
            .map(|s| Stream::Tls(Box::new(s)))
            .map_err(|e| match e.kind() {
                io::ErrorKind::InvalidData => Failure::Refused(e.to_string()),
                _ => Failure::Unreachable(e),
            })
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = tls;
        Err(Failure::Refused(
            "rediss:// needs redlock-mux built with its `tls` feature".into(),
        ))
    }
}

/// What `INFO server` says a node runs: `("valkey", "8.1.8")`, `("redis", "7.0.15")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis` or `valkey`.
    pub name: String,
    /// `major.minor.patch`.
    pub version: String,
}

impl ServerInfo {
    /// Reads `INFO server` as the library does: Valkey says `server_name:valkey` and
    /// `valkey_version`; Redis only `redis_version`.
    pub fn parse(text: &[u8]) -> Option<ServerInfo> {
        let text = String::from_utf8_lossy(text);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let valkey = field("valkey_version");
        let name = match field("server_name") {
            Some(n) => n,
            None if valkey.is_some() => "valkey".to_owned(),
            None => "redis".to_owned(),
        };
        let version = valkey.or_else(|| field("redis_version"))?;
        Some(ServerInfo { name, version })
    }
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-server {}", self.name, self.version)
    }
}

/// One blocking connection, authenticated and on the URL's database.
pub struct NodeConn {
    stream: Stream,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// On a Redis Cluster URL: the masters that `MOVED` replies named.
    cluster: Option<Box<Masters>>,
}

/// The masters of a Redis Cluster a connection to one of its seeds was redirected to, each
/// connected once.
struct Masters {
    url: NodeUrl,
    tls: TlsFiles,
    timeout: Duration,
    conns: Vec<(std::net::SocketAddr, NodeConn)>,
}

/// The address a `MOVED slot host:port` error names.
fn moved_to(error: &[u8]) -> Option<std::net::SocketAddr> {
    let text = std::str::from_utf8(error).ok()?;
    let mut words = text.split(' ');
    if words.next()? != "MOVED" {
        return None;
    }
    let to = words.nth(1)?;
    let (host, port) = to.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port.parse::<u16>().ok()?))
        .ok()?
        .next()
}

impl NodeConn {
    /// Connects to `url` (over TLS with `tls`'s files for a `rediss://` URL), sends `AUTH`
    /// and `SELECT` as it asks, and sets `timeout` on connect and on every read and write.
    pub fn connect(url: &NodeUrl, tls: &TlsFiles, timeout: Duration) -> Result<NodeConn, Failure> {
        let stream = open(url, tls, timeout)?;
        let mut conn = NodeConn {
            stream,
            buf: vec![0; 4096],
            out: Vec::with_capacity(256),
            cluster: url.is_cluster().then(|| {
                Box::new(Masters {
                    url: url.clone(),
                    tls: tls.clone(),
                    timeout,
                    conns: Vec::new(),
                })
            }),
        };
        if let Some(password) = url.password() {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            args.extend(url.user());
            args.push(password);
            conn.call_ok(&args)?;
        }
        if url.db() != 0 {
            conn.call_ok(&[b"SELECT", url.db().to_string().as_bytes()])?;
        }
        Ok(conn)
    }

    /// What `INFO server` says the node runs, if it says.
    pub fn server(&mut self) -> Result<Option<ServerInfo>, Failure> {
        match self.call(&[b"INFO", b"server"])? {
            Value::Bulk(Some(text)) => Ok(ServerInfo::parse(&text)),
            _ => Ok(None),
        }
    }

    /// Sends one command and reads its reply, error replies included. On a Redis Cluster, a
    /// `MOVED` reply sends the command to the master it names (one hop).
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Value, Failure> {
        let reply = self.call_here(args)?;
        let (Value::Error(e), Some(masters)) = (&reply, self.cluster.as_mut()) else {
            return Ok(reply);
        };
        let Some(addr) = moved_to(e) else {
            return Ok(reply);
        };
        let i = match masters.conns.iter().position(|(a, _)| *a == addr) {
            Some(i) => i,
            None => {
                let Some(url) = masters.url.cluster_master(addr) else {
                    return Ok(reply);
                };
                let conn = NodeConn::connect(&url, &masters.tls, masters.timeout)?;
                masters.conns.push((addr, conn));
                masters.conns.len() - 1
            }
        };
        masters.conns[i].1.call_here(args)
    }

    /// Sends one command on this connection and reads its reply.
    fn call_here(&mut self, args: &[&[u8]]) -> Result<Value, Failure> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        self.stream.write_all(&self.out)?;
        self.stream.flush()?;
        self.read()
    }

    /// Like [`call`](Self::call), but an error reply is [`Failure::Refused`].
    pub fn call_ok(&mut self, args: &[&[u8]]) -> Result<Value, Failure> {
        match self.call(args)? {
            Value::Error(e) => Err(Failure::Refused(String::from_utf8_lossy(&e).into_owned())),
            v => Ok(v),
        }
    }

    /// Reads one whole reply.
    fn read(&mut self) -> Result<Value, Failure> {
        let limits = Limits::default();
        let mut filled = 0;
        loop {
            if filled == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let read = match self.stream.read(&mut self.buf[filled..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if read == 0 {
                return Err(Failure::Unreachable(io::ErrorKind::UnexpectedEof.into()));
            }
            filled += read;
            match resp::decode(&self.buf[..filled], &limits) {
                Ok(Status::Complete((reply, _))) => return Ok(reply.to_value()),
                Ok(Status::Partial) => continue,
                Err(e) => return Err(Failure::NotRedis(format!("not RESP ({e})"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_names_the_master() {
        assert_eq!(
            moved_to(b"MOVED 3999 127.0.0.1:6381"),
            Some("127.0.0.1:6381".parse().unwrap())
        );
        assert_eq!(
            moved_to(b"MOVED 1 [::1]:7000"),
            Some("[::1]:7000".parse().unwrap())
        );
        assert_eq!(moved_to(b"ASK 3999 127.0.0.1:6381"), None);
        assert_eq!(moved_to(b"MOVED 3999"), None);
    }

    #[test]
    fn info_server_names_the_server() {
        let redis = ServerInfo::parse(b"# Server\r\nredis_version:7.0.15\r\nrun_id:x\r\n").unwrap();
        assert_eq!(redis.to_string(), "redis-server 7.0.15");
        let valkey = ServerInfo::parse(
            b"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        )
        .unwrap();
        assert_eq!(valkey.to_string(), "valkey-server 8.1.8");
        assert_eq!(ServerInfo::parse(b"# Server\r\n"), None);
    }
}
