//! Masters managed by Redis Sentinel, for the tests and `bench --sentinel`: per member a master, a replica of it and
//! three sentinels (`redis-server CONFIG --sentinel`), each on a free port of 127.0.0.1 with a
//! temporary directory and no persistence, stopped by PID when dropped (even on a panic).

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::resp::Value;

use crate::local_servers::{free_port, RedisServer};
use crate::probe::{cmd, cmd_auth, try_cmd};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// How long a sentinel takes to say its master is down.
pub const DOWN_AFTER_MS: u64 = 1000;
/// Sentinel's failover timeout (also the least time between two failovers of one master).
pub const FAILOVER_TIMEOUT_MS: u64 = 3000;

/// One sentinel process.
#[derive(Debug)]
pub struct Sentinel {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    password: Option<String>,
}

impl Sentinel {
    /// Starts a sentinel watching `service` at `master`, with `password` as its own
    /// `requirepass` (and the one it gives the other sentinels) if given.
    pub fn start(
        service: &str,
        master: SocketAddr,
        password: Option<&str>,
    ) -> io::Result<Sentinel> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!(
                "redlock-mux-sentinel-{}-{}-{}",
                std::process::id(),
                port,
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir)?;
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
                 dir {dir}\nlogfile {dir}/sentinel.log\nloglevel notice\n\
                 sentinel monitor {service} {ip} {mport} 2\n\
                 sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {service} 1\n",
                dir = dir.display(),
                ip = master.ip(),
                mport = master.port(),
            );
            if let Some(pw) = password {
                conf += &format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n");
            }
            let file = dir.join("sentinel.conf");
            fs::write(&file, conf)?;
            let program = std::env::var(crate::local_servers::REDIS_SERVER_ENV)
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "redis-server".to_owned());
            let child = Command::new(program)
                .arg(&file)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut s = Sentinel {
                child: Some(child),
                port,
                dir,
                password: password.map(str::to_owned),
            };
            if s.wait_ready() {
                return Ok(s);
            }
            last = Some(io::Error::other(format!(
                "sentinel on port {port} did not start"
            )));
            s.kill();
        }
        Err(last.unwrap_or_else(|| io::Error::other("sentinel did not start")))
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            if try_cmd(self.addr(), &[b"PING"], Duration::from_millis(200)).is_ok() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A command to this sentinel, authenticated if it has a password.
    pub fn cmd(&self, args: &[&[u8]]) -> Value {
        match &self.password {
            Some(pw) => cmd_auth(self.addr(), pw, args),
            None => cmd(self.addr(), args),
        }
    }

    /// Stops it (`SIGKILL`, by its PID).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A quorum member managed by Sentinel: a master, a replica, three sentinels.
pub struct SentinelMember {
    pub service: String,
    /// The first master, then its replicas: any may be the master after a failover.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelMember {
    /// Starts one, with sentinels that have `sentinel_password` if given, and waits until the
    /// sentinels know the replica and one another (what a failover needs).
    pub fn start(sentinel_password: Option<&str>) -> io::Result<SentinelMember> {
        Self::start_with(1, sentinel_password)
    }

    /// [`start`](Self::start) with `replicas` replicas of the master.
    pub fn start_with(
        replicas: usize,
        sentinel_password: Option<&str>,
    ) -> io::Result<SentinelMember> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let service = format!("svc{}-{n}", std::process::id());
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"])?;
        let port = master.port().to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&[
                "--repl-diskless-sync-delay",
                "0",
                "--replicaof",
                "127.0.0.1",
                &port,
            ])?);
        }
        let master = &servers[0];
        let online = || {
            matches!(cmd(master.addr(), &[b"INFO", b"replication"]),
                Value::Bulk(Some(t)) if String::from_utf8_lossy(&t).matches("state=online").count() == replicas)
        };
        if !crate::probe::eventually(Duration::from_secs(10), online) {
            return Err(io::Error::other("the replica did not link"));
        }
        let sentinels = (0..3)
            .map(|_| Sentinel::start(&service, master.addr(), sentinel_password))
            .collect::<io::Result<Vec<_>>>()?;
        let member = SentinelMember {
            service,
            servers,
            sentinels,
        };
        let slaves = replicas.to_string();
        let ready = || {
            member.sentinels.iter().all(|s| {
                let fields = member.master_fields(s);
                fields.get("num-other-sentinels").map(String::as_str) == Some("2")
                    && fields.get("num-slaves") == Some(&slaves)
            })
        };
        if !crate::probe::eventually(Duration::from_secs(20), ready) {
            return Err(io::Error::other("the sentinels did not find one another"));
        }
        Ok(member)
    }

    /// `SENTINEL master SERVICE` on `s`, as a map.
    fn master_fields(&self, s: &Sentinel) -> std::collections::HashMap<String, String> {
        let mut out = std::collections::HashMap::new();
        if let Value::Array(Some(items)) = s.cmd(&[b"SENTINEL", b"master", self.service.as_bytes()])
        {
            for pair in items.chunks(2) {
                if let [Value::Bulk(Some(k)), Value::Bulk(Some(v))] = pair {
                    out.insert(
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(v).into_owned(),
                    );
                }
            }
        }
        out
    }

    /// The member's URL: its three sentinels and its service (`query` appended: `?wait=1`...).
    pub fn url(&self, query: &str) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        format!(
            "redis+sentinel://{}/{}{query}",
            hosts.join(","),
            self.service
        )
    }

    /// The master the first live sentinel names now.
    pub fn named_master(&self) -> Option<SocketAddr> {
        for s in &self.sentinels {
            if s.child.is_none() {
                continue;
            }
            if let Value::Array(Some(items)) = s.cmd(&[
                b"SENTINEL",
                b"get-master-addr-by-name",
                self.service.as_bytes(),
            ]) {
                if let [Value::Bulk(Some(h)), Value::Bulk(Some(p))] = &items[..] {
                    let text = format!(
                        "{}:{}",
                        String::from_utf8_lossy(h),
                        String::from_utf8_lossy(p)
                    );
                    return text.parse().ok();
                }
            }
        }
        None
    }
}
