//! A blocking connection to one node, for `inspect`: one `TcpStream`, the library's URL parser
//! and RESP codec, and failures sorted by what they say about the node.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redlock_mux::resp::{self, Limits, Status, Value};
use redlock_mux::NodeUrl;

/// Why a node could not be read.
#[derive(Debug)]
pub enum Failure {
    /// No connection, or no answer in time: the node may be down.
    Unreachable(io::Error),
    /// The node answered with an error: a wrong password or user, a database it does not
    /// have, missing permissions.
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

/// One blocking connection, authenticated and on the URL's database.
pub struct NodeConn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl NodeConn {
    /// Connects to `url`, sends `AUTH` and `SELECT` as it asks, and sets `timeout` on connect
    /// and on every read and write.
    pub fn connect(url: &NodeUrl, timeout: Duration) -> Result<NodeConn, Failure> {
        let stream = crate::raw::connect_first(url.addrs(), timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = NodeConn {
            stream,
            buf: vec![0; 4096],
            out: Vec::with_capacity(256),
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

    /// Sends one command and reads its reply, error replies included.
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Value, Failure> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        self.stream.write_all(&self.out)?;
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
