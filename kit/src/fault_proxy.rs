//! An in-process TCP fault proxy for the fault suite: it listens on 127.0.0.1 and forwards each
//! connection to one real `redis-server`, and on command adds delay, blackholes traffic, drops
//! the server's replies after the server ran the command, or resets every connection.
//!
//! Std threads only: one accept thread, two pump threads per connection, all polling a stop
//! flag every few milliseconds, so dropping the proxy ends and joins them all.
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ProxyFault {
    /// Forward both ways.
    None = 0,
    /// Forward both ways, each chunk after the proxy's delay.
    Delay = 1,
    /// Accept and read, but forward nothing either way.
    Blackhole = 2,
    /// Forward commands to the server, which runs them; throw its replies away.
    DropReplies = 3,
    /// Close both sides of every connection, and every new one as it is accepted.
    Reset = 4,
}

impl ProxyFault {
    fn from_u8(v: u8) -> ProxyFault {
        match v {
            1 => ProxyFault::Delay,
            2 => ProxyFault::Blackhole,
            3 => ProxyFault::DropReplies,
            4 => ProxyFault::Reset,
            _ => ProxyFault::None,
        }
    }
}

/// How often blocked reads wake up to look at the fault and the stop flag.
const POLL: Duration = Duration::from_millis(10);

struct Shared {
    upstream: SocketAddr,
    delay: Duration,
    fault: AtomicU8,
    stop: AtomicBool,
    /// Chunks delayed, discarded, or connections reset.
    hits: AtomicU64,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

/// A fault proxy in front of one server.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port; [`ProxyFault::Delay`] adds `delay`.
    pub fn start(upstream: SocketAddr, delay: Duration) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            delay,
            fault: AtomicU8::new(ProxyFault::None as u8),
            stop: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            pumps: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || accept_loop(&listener, &s));
        Ok(FaultProxy {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches the fault for every connection, open or new.
    pub fn set(&self, fault: ProxyFault) {
        self.shared.fault.store(fault as u8, Ordering::SeqCst);
    }

    /// Chunks delayed or discarded and connections reset so far.
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let pumps = std::mem::take(&mut *self.shared.pumps.lock().unwrap());
        for p in pumps {
            let _ = p.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, s: &Arc<Shared>) {
    while !s.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                if let Err(e) = connect(client, s) {
                    eprintln!("fault proxy: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(2))
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

fn connect(client: TcpStream, s: &Arc<Shared>) -> io::Result<()> {
    client.set_nonblocking(false)?;
    if ProxyFault::from_u8(s.fault.load(Ordering::SeqCst)) == ProxyFault::Reset {
        s.hits.fetch_add(1, Ordering::SeqCst);
        return client.shutdown(Shutdown::Both);
    }
    let server = TcpStream::connect_timeout(&s.upstream, Duration::from_secs(1))?;
    for stream in [&client, &server] {
        stream.set_read_timeout(Some(POLL))?;
        stream.set_nodelay(true)?;
    }
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let (sa, sb) = (s.clone(), s.clone());
    let mut pumps = s.pumps.lock().unwrap();
    pumps.retain(|p| !p.is_finished());
    pumps.push(thread::spawn(move || pump(client, server, false, &sa)));
    pumps.push(thread::spawn(move || pump(s2, c2, true, &sb)));
    Ok(())
}

/// Copies `from` to `to`; `reply` is the server-to-client direction.
fn pump(mut from: TcpStream, mut to: TcpStream, reply: bool, s: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    let close = |a: &TcpStream, b: &TcpStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    while !s.stop.load(Ordering::SeqCst) {
        let fault = ProxyFault::from_u8(s.fault.load(Ordering::SeqCst));
        if fault == ProxyFault::Reset {
            s.hits.fetch_add(1, Ordering::SeqCst);
            return close(&from, &to);
        }
        let n = match from.read(&mut buf) {
            Ok(0) => return close(&from, &to),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => return close(&from, &to),
        };
        // The fault when the bytes arrived decides their fate.
        let fault = ProxyFault::from_u8(s.fault.load(Ordering::SeqCst));
        match fault {
            ProxyFault::Blackhole => {
                s.hits.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            ProxyFault::DropReplies if reply => {
                s.hits.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            ProxyFault::Delay => {
                s.hits.fetch_add(1, Ordering::SeqCst);
                thread::sleep(s.delay);
            }
            ProxyFault::Reset => {
                s.hits.fetch_add(1, Ordering::SeqCst);
                return close(&from, &to);
            }
            _ => {}
        }
        if to.write_all(&buf[..n]).is_err() {
            return close(&from, &to);
        }
    }
    close(&from, &to);
}
