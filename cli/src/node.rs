//! A blocking connection to one node, for the baseline of `bench` and for `inspect`: the
//! plainest client there is, one `TcpStream` with `TCP_NODELAY`, and the library's RESP codec.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use redlock_mux::resp::{self, Limits, Reply, Status, Value};

/// One blocking connection, authenticated and on the URL's database.
pub struct NodeConn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl NodeConn {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]` or `host:port`), sends
    /// `AUTH` and `SELECT` as the URL asks, and sets `timeout` on connect and on reads.
    pub fn connect(url: &str, timeout: Duration) -> io::Result<NodeConn> {
        let target = UrlParts::parse(url);
        let addr = target
            .host_port
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::other(format!("{url}: no address")))?;
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = NodeConn {
            stream,
            buf: vec![0; 4096],
            out: Vec::with_capacity(256),
        };
        if let Some(password) = &target.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &target.user {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            conn.call_ok(&args)?;
        }
        if let Some(db) = &target.db {
            conn.call_ok(&[b"SELECT", db.as_bytes()])?;
        }
        Ok(conn)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        self.stream.write_all(&self.out)?;
        self.read_with(|r| r.to_value())
    }

    /// Like [`call`](Self::call), but an error reply is an error.
    pub fn call_ok(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        match self.call(args)? {
            Value::Error(e) => Err(io::Error::other(String::from_utf8_lossy(&e).into_owned())),
            v => Ok(v),
        }
    }

    /// Writes raw, already encoded bytes.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one whole reply and hands it to `f` without copying it.
    pub fn read_with<R>(&mut self, f: impl FnOnce(&Reply<'_>) -> R) -> io::Result<R> {
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
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            filled += read;
            match resp::decode(&self.buf[..filled], &limits) {
                Ok(Status::Complete((reply, _))) => return Ok(f(&reply)),
                Ok(Status::Partial) => continue,
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
        }
    }
}

/// The parts of a node URL a plain connection needs; the library validates URLs fully.
struct UrlParts {
    host_port: String,
    user: Option<String>,
    password: Option<String>,
    db: Option<String>,
}

impl UrlParts {
    fn parse(url: &str) -> UrlParts {
        let rest = url.strip_prefix("redis://").unwrap_or(url);
        let (rest, db) = match rest.split_once('/') {
            Some((r, db)) if !db.is_empty() && db != "0" => (r, Some(db.to_owned())),
            Some((r, _)) => (r, None),
            None => (rest, None),
        };
        let (auth, host_port) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (user, password) = match auth.map(|a| a.split_once(':')) {
            Some(Some((u, p))) => ((!u.is_empty()).then(|| u.to_owned()), Some(p.to_owned())),
            Some(None) => (None, auth.map(str::to_owned)),
            None => (None, None),
        };
        UrlParts {
            host_port: host_port.to_owned(),
            user,
            password,
            db,
        }
    }
}
