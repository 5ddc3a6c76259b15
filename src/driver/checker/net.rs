//! The checker's network: in-memory connections to simulated servers (the simulation's own,
//! `engine::sim::server`), behind the driver's socket and poller interfaces. A node answers a
//! write at once, or after its delay on the virtual clock (then it also runs the command only
//! then, as a slow server does).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mio::Token;

use super::world::{Kind, World};
use crate::engine::sim::node::Node;
use crate::engine::sim::server::{Server, Session as ServerSession};
use crate::error::NodeErrorKind;
use crate::url::Target;

/// The nodes, and every connection made to them.
pub(crate) struct Net {
    /// The port of each node's address (127.0.0.1).
    ports: Vec<u16>,
    pub servers: Vec<Server>,
    /// How long each node takes to run a command and answer.
    delays: Vec<Duration>,
    conns: Vec<Conn>,
    /// Connections that got something since the poller last looked.
    ready: Vec<Token>,
    woken: bool,
    /// Commands a slow node runs later: when, on which connection, the command.
    pending: Vec<(Duration, usize, Vec<u8>)>,
    now: Duration,
}

struct Conn {
    node: usize,
    token: Token,
    session: ServerSession,
    to_client: Vec<u8>,
    open: bool,
}

impl Net {
    /// Nodes at 127.0.0.1 on `ports`, answering after `delays`.
    pub fn new(ports: &[u16], delays: &[Duration]) -> Net {
        Net {
            ports: ports.to_vec(),
            servers: (0..ports.len())
                .map(|n| {
                    let mut run_id = [b'0'; 40];
                    run_id[39] = b'a' + n as u8;
                    Server::new(Node::default(), (7, 2, 4), run_id)
                })
                .collect(),
            delays: delays.to_vec(),
            conns: Vec::new(),
            ready: Vec::new(),
            woken: false,
            pending: Vec::new(),
            now: Duration::ZERO,
        }
    }

    pub fn has_events(&self) -> bool {
        self.woken || !self.ready.is_empty()
    }

    /// When the next command of a slow node is due.
    pub fn next_delivery(&self) -> Option<Duration> {
        self.pending.iter().map(|p| p.0).min()
    }

    /// Runs the commands of slow nodes that are due at `now`.
    pub fn deliver(&mut self, now: Duration) {
        self.now = now;
        let mut due = Vec::new();
        self.pending.retain(|p| {
            if p.0 <= now {
                due.push(p.clone());
                false
            } else {
                true
            }
        });
        for (_, conn, command) in due {
            self.run(conn, &command);
        }
    }

    fn run(&mut self, conn: usize, command: &[u8]) {
        let c = &mut self.conns[conn];
        if !c.open {
            return;
        }
        let now_ms = 1_000_000 + self.now.as_millis() as i64;
        let mut out = Vec::new();
        self.servers[c.node].execute(&mut c.session, now_ms, command, &mut out);
        if !out.is_empty() {
            c.to_client.extend_from_slice(&out);
            if !self.ready.contains(&c.token) {
                self.ready.push(c.token);
            }
        }
    }

    /// The client wrote `bytes` on `conn`.
    fn receive(&mut self, conn: usize, bytes: &[u8]) {
        let commands = self.conns[conn].session.receive(bytes);
        let delay = self.delays[self.conns[conn].node];
        for (command, _) in commands {
            if delay.is_zero() {
                self.run(conn, &command);
            } else {
                let at = self.now + delay;
                self.pending.push((at, conn, command));
            }
        }
    }
}

/// A connection's socket.
#[derive(Debug)]
pub(crate) struct Socket {
    world: Arc<World>,
    conn: usize,
    connecting: bool,
}

/// No TLS in the checker.
pub(crate) type Session = std::convert::Infallible;

/// No names here: the checker's servers are named by their addresses.
pub(crate) fn resolve(_host: &str, _port: u16) -> Option<SocketAddr> {
    None
}

/// No node of the checker is a TLS port.
pub(crate) fn answers_tls(_addr: SocketAddr, _timeout: Duration) -> bool {
    false
}

impl Socket {
    pub fn connect(
        target: Target<'_>,
        _tls: Option<Session>,
        _dead_after: Duration,
        registry: &Registry,
        token: Token,
    ) -> io::Result<Socket> {
        let Target::Tcp(addr) = target else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        let world = registry.world.clone();
        let mut s = world.lock();
        let Some(node) = s.net.ports.iter().position(|&p| p == addr.port()) else {
            return Err(io::ErrorKind::ConnectionRefused.into());
        };
        let conn = s.net.conns.len();
        s.net.conns.push(Conn {
            node,
            token,
            session: ServerSession::default(),
            to_client: Vec::new(),
            open: true,
        });
        // The connect is over at once: the poller says so.
        s.net.ready.push(token);
        world.wake(&mut s);
        drop(s);
        Ok(Socket {
            world,
            conn,
            connecting: true,
        })
    }

    pub fn is_connecting(&self) -> bool {
        self.connecting
    }

    pub fn is_handshaking(&self) -> bool {
        false
    }

    pub fn finish_connect(&mut self) -> Result<bool, NodeErrorKind> {
        self.connecting = false;
        Ok(true)
    }

    pub fn hung_up(&mut self) {}

    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, NodeErrorKind> {
        let mut s = self.world.lock();
        s.net.now = s.now;
        s.net.receive(self.conn, bytes);
        self.world.wake(&mut s);
        Ok(bytes.len())
    }

    pub fn read(&mut self, buf: &mut [u8]) -> Result<Option<(usize, bool)>, NodeErrorKind> {
        let mut s = self.world.lock();
        let c = &mut s.net.conns[self.conn];
        if c.to_client.is_empty() {
            return Ok(None);
        }
        let n = buf.len().min(c.to_client.len());
        buf[..n].copy_from_slice(&c.to_client[..n]);
        c.to_client.drain(..n);
        Ok(Some((n, n < buf.len())))
    }

    pub fn update_interest(&mut self, _registry: &Registry, _output: bool) -> io::Result<()> {
        Ok(())
    }

    pub fn close(self, _registry: &Registry) {
        let mut s = self.world.lock();
        s.net.conns[self.conn].open = false;
        s.net.conns[self.conn].to_client.clear();
    }
}

/// The poller: waits on the world for a connection's news or the waker.
pub(crate) struct Poll {
    registry: Registry,
}

pub(crate) struct Registry {
    world: Arc<World>,
}

pub(crate) struct Waker {
    world: Arc<World>,
}

pub(crate) struct Events {
    list: Vec<Event>,
}

pub(crate) struct Event {
    token: Token,
}

impl Poll {
    pub fn new() -> io::Result<Poll> {
        Ok(Poll {
            registry: Registry {
                world: World::get(),
            },
        })
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn poll(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        let world = &self.registry.world;
        world.wait(Kind::Poll, timeout);
        let mut s = world.lock();
        events.list.clear();
        s.net.woken = false;
        let ready = std::mem::take(&mut s.net.ready);
        events
            .list
            .extend(ready.into_iter().map(|token| Event { token }));
        Ok(())
    }
}

impl Registry {
    pub fn try_clone(&self) -> io::Result<Registry> {
        Ok(Registry {
            world: self.world.clone(),
        })
    }
}

impl Waker {
    pub fn new(registry: &Registry, _token: Token) -> io::Result<Waker> {
        Ok(Waker {
            world: registry.world.clone(),
        })
    }

    pub fn wake(&self) -> io::Result<()> {
        let mut s = self.world.lock();
        s.net.woken = true;
        self.world.wake(&mut s);
        Ok(())
    }
}

impl Events {
    pub fn with_capacity(n: usize) -> Events {
        Events {
            list: Vec::with_capacity(n),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Event> {
        self.list.iter()
    }
}

impl Event {
    pub fn token(&self) -> Token {
        self.token
    }

    pub fn is_read_closed(&self) -> bool {
        false
    }

    pub fn is_error(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("World")
    }
}
