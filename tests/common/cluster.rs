//! Redis Clusters for the tests: [`ClusterMember`] is one cluster (one quorum member) of
//! `redis-server` processes started with `--cluster-enabled yes` on free loopback ports and
//! joined with `redis-cli --cluster create`. Every server is a [`RedisServer`], killed by PID
//! (and its directory removed) when the member drops, also while a failed test unwinds.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::resp::Value;
use redlock_mux_kit::local_servers::RedisServer;
use redlock_mux_kit::probe::cmd;

/// How long a cluster may take to agree on its slots after it is created or changed.
pub const SETTLE: Duration = Duration::from_secs(20);

/// One Redis Cluster: masters first (in the order `redis-cli` gave them slots), then
/// replicas.
pub struct ClusterMember {
    pub servers: Vec<RedisServer>,
    masters: usize,
}

/// The arguments that make a server a cluster node; its `nodes.conf` goes in its own
/// directory (the server runs in it).
fn cluster_args() -> [&'static str; 6] {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "2000",
    ]
}

fn text(v: &Value) -> String {
    match v {
        Value::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        Value::Simple(s) => String::from_utf8_lossy(s).into_owned(),
        other => format!("{other:?}"),
    }
}

impl ClusterMember {
    /// A cluster of `masters` masters (and `replicas` replicas, each of one master in turn),
    /// every slot served, every node agreeing.
    pub fn start(masters: usize, replicas: usize) -> io::Result<ClusterMember> {
        Self::start_inner(None, masters, replicas)
    }

    /// [`start`](Self::start) with the `redis-server` binary `program` (Redis 8, say).
    pub fn start_program(
        program: &std::path::Path,
        masters: usize,
        replicas: usize,
    ) -> io::Result<ClusterMember> {
        Self::start_inner(Some(program), masters, replicas)
    }

    fn start_inner(
        program: Option<&std::path::Path>,
        masters: usize,
        replicas: usize,
    ) -> io::Result<ClusterMember> {
        let mut servers = Vec::new();
        for _ in 0..masters + replicas {
            servers.push(match program {
                Some(p) => RedisServer::start_program(p, &cluster_args())?,
                None => RedisServer::start_with(&cluster_args())?,
            });
        }
        let member = ClusterMember { servers, masters };
        member.create()?;
        member.wait_ok()?;
        for r in 0..replicas {
            let replica = member.servers[masters + r].addr();
            let master = member.servers[r % masters].addr();
            let id = member.node_id(master);
            cmd(
                replica,
                &[
                    b"CLUSTER",
                    b"MEET",
                    master.ip().to_string().as_bytes(),
                    master.port().to_string().as_bytes(),
                ],
            );
            let deadline = Instant::now() + SETTLE;
            loop {
                let v = cmd(replica, &[b"CLUSTER", b"REPLICATE", id.as_bytes()]);
                if matches!(v, Value::Simple(_)) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(io::Error::other(format!("CLUSTER REPLICATE: {v:?}")));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        if replicas > 0 {
            member.wait_replicas(replicas)?;
        }
        Ok(member)
    }

    /// Joins the masters with `redis-cli --cluster create`, bounded in time. On a loaded
    /// machine a node may give up a cluster-bus handshake (after the node timeout) and never
    /// retry it, and `redis-cli` would then wait for the join for ever: once every master has
    /// its slots and has met another node, the masters are told to meet again until
    /// `redis-cli` sees them agree.
    fn create(&self) -> io::Result<()> {
        let log = self.servers[0].dir().join("create.log");
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for s in &self.servers[..self.masters] {
            create.arg(s.addr().to_string());
        }
        create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log)?)
            .stderr(Stdio::null());
        let mut child = create.spawn()?;
        let deadline = Instant::now() + SETTLE;
        let masters = self.masters();
        loop {
            if let Some(status) = child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                return Err(io::Error::other(format!(
                    "redis-cli --cluster create failed: {}",
                    fs::read_to_string(&log).unwrap_or_default()
                )));
            }
            if Instant::now() >= deadline {
                // Our own child, by its PID.
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!(
                    "redis-cli --cluster create did not finish in {SETTLE:?}: {}",
                    fs::read_to_string(&log).unwrap_or_default()
                )));
            }
            // Once redis-cli has given every master its slots and epoch and started the
            // meetings (each master knows another node), meeting again changes nothing but a
            // lost handshake.
            let meeting = masters.iter().all(|&a| {
                let info = text(&cmd(a, &[b"CLUSTER", b"INFO"]));
                !info.contains("cluster_slots_assigned:0\r")
                    && !info.contains("cluster_known_nodes:1\r")
            });
            if meeting {
                for &a in &masters {
                    for &b in &masters {
                        if a != b {
                            let _ = cmd(
                                a,
                                &[
                                    b"CLUSTER",
                                    b"MEET",
                                    b.ip().to_string().as_bytes(),
                                    b.port().to_string().as_bytes(),
                                ],
                            );
                        }
                    }
                }
            }
            thread::sleep(Duration::from_millis(500));
        }
    }

    /// The member's URL: every node a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.servers.iter().map(|s| s.addr().to_string()).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The masters' addresses, as created.
    pub fn masters(&self) -> Vec<SocketAddr> {
        self.servers[..self.masters]
            .iter()
            .map(RedisServer::addr)
            .collect()
    }

    /// The cluster node id of the server at `addr`.
    pub fn node_id(&self, addr: SocketAddr) -> String {
        text(&cmd(addr, &[b"CLUSTER", b"MYID"]))
    }

    /// The slot `key` hashes to, as the cluster computes it.
    pub fn slot(&self, key: &[u8]) -> u16 {
        match cmd(self.servers[0].addr(), &[b"CLUSTER", b"KEYSLOT", key]) {
            Value::Integer(n) => n as u16,
            other => panic!("CLUSTER KEYSLOT: {other:?}"),
        }
    }

    /// Which of `candidates` serves `slot` now, by `CLUSTER SLOTS` asked of the first.
    pub fn owner(&self, slot: u16, ask: SocketAddr) -> Option<SocketAddr> {
        let Value::Array(Some(ranges)) = cmd(ask, &[b"CLUSTER", b"SLOTS"]) else {
            return None;
        };
        for r in ranges {
            let Value::Array(Some(f)) = r else { continue };
            let (Some(Value::Integer(a)), Some(Value::Integer(b)), Some(Value::Array(Some(m)))) =
                (f.first(), f.get(1), f.get(2))
            else {
                continue;
            };
            if (*a..=*b).contains(&i64::from(slot)) {
                let (Some(host), Some(Value::Integer(port))) = (m.first(), m.get(1)) else {
                    continue;
                };
                return format!("{}:{port}", text(host)).parse().ok();
            }
        }
        None
    }

    /// Waits until every node says `cluster_state:ok` and knows every other node.
    pub fn wait_ok(&self) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let ok = self.servers[..self.masters]
                .iter()
                .all(|s| text(&cmd(s.addr(), &[b"CLUSTER", b"INFO"])).contains("cluster_state:ok"));
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(
                    "the cluster did not reach cluster_state:ok",
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_replicas(&self, replicas: usize) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let linked = self.servers[self.masters..self.masters + replicas]
                .iter()
                .all(|s| {
                    let info = text(&cmd(s.addr(), &[b"INFO", b"replication"]));
                    info.contains("role:slave") && info.contains("master_link_status:up")
                });
            if linked {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other("the replicas did not link up"));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many times the server at `addr` ran `command` (lower case), by `INFO commandstats`.
    pub fn calls(addr: SocketAddr, command: &str) -> u64 {
        let info = text(&cmd(addr, &[b"INFO", b"commandstats"]));
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// How many `prefix` errors the server at `addr` answered, by `INFO errorstats`.
    pub fn errors(addr: SocketAddr, prefix: &str) -> u64 {
        let info = text(&cmd(addr, &[b"INFO", b"errorstats"]));
        let line = format!("errorstat_{prefix}:count=");
        info.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Moves `slot` from the master at `from` to the one at `to`, with its keys, as
    /// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` and `MIGRATING`, `MIGRATE`
    /// of every key in it, then `SETSLOT NODE` on both. `between` runs after the slot is
    /// marked migrating and before its keys move (to let clients meet `ASK`).
    pub fn migrate(&self, slot: u16, from: SocketAddr, to: SocketAddr, between: impl FnOnce()) {
        let slot_s = slot.to_string();
        let from_id = self.node_id(from);
        let to_id = self.node_id(to);
        let ok = |v: Value| assert!(matches!(v, Value::Simple(_)), "{v:?}");
        ok(cmd(
            to,
            &[
                b"CLUSTER",
                b"SETSLOT",
                slot_s.as_bytes(),
                b"IMPORTING",
                from_id.as_bytes(),
            ],
        ));
        ok(cmd(
            from,
            &[
                b"CLUSTER",
                b"SETSLOT",
                slot_s.as_bytes(),
                b"MIGRATING",
                to_id.as_bytes(),
            ],
        ));
        between();
        let deadline = Instant::now() + SETTLE;
        loop {
            let Value::Array(Some(keys)) = cmd(
                from,
                &[b"CLUSTER", b"GETKEYSINSLOT", slot_s.as_bytes(), b"100"],
            ) else {
                panic!("GETKEYSINSLOT");
            };
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<Vec<u8>> = vec![
                b"MIGRATE".to_vec(),
                to.ip().to_string().into_bytes(),
                to.port().to_string().into_bytes(),
                b"".to_vec(),
                b"0".to_vec(),
                b"5000".to_vec(),
                b"KEYS".to_vec(),
            ];
            for k in keys {
                if let Value::Bulk(Some(k)) = k {
                    args.push(k);
                }
            }
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let v = cmd(from, &refs);
            assert!(
                matches!(v, Value::Simple(_))
                    || matches!(&v, Value::Error(e) if e.starts_with(b"NOKEY")),
                "MIGRATE: {v:?}"
            );
            assert!(
                Instant::now() < deadline,
                "keys of slot {slot} did not move"
            );
        }
        for node in [to, from] {
            ok(cmd(
                node,
                &[
                    b"CLUSTER",
                    b"SETSLOT",
                    slot_s.as_bytes(),
                    b"NODE",
                    to_id.as_bytes(),
                ],
            ));
        }
        // The other masters learn it through the cluster bus (one that was killed, not at
        // all).
        for s in &self.servers[..self.masters] {
            let a = s.addr();
            if a != from && a != to {
                let _ = redlock_mux_kit::probe::try_cmd(
                    a,
                    &[
                        b"CLUSTER",
                        b"SETSLOT",
                        slot_s.as_bytes(),
                        b"NODE",
                        to_id.as_bytes(),
                    ],
                    Duration::from_secs(2),
                );
            }
        }
    }

    /// Every key on every server (masters only), for the check that nothing was left.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        for s in &self.servers {
            let info = text(&cmd(s.addr(), &[b"INFO", b"replication"]));
            if info.contains("role:master") {
                all.extend(redlock_mux_kit::probe::keys(s.addr()));
            }
        }
        all
    }
}

impl ClusterMember {
    /// `n` keys named `prefix:N` whose slots the master at `master` serves.
    pub fn keys_of(&self, master: SocketAddr, prefix: &str, n: usize) -> Vec<String> {
        let keys: Vec<String> = (0..100_000)
            .map(|i| format!("{prefix}:{i}"))
            .filter(|k| self.owner(self.slot(k.as_bytes()), master) == Some(master))
            .take(n)
            .collect();
        assert_eq!(keys.len(), n, "{n} keys of the master at {master}");
        keys
    }

    /// A key named `prefix:N` whose slot the master at `master` serves.
    pub fn key_of(&self, master: SocketAddr, prefix: &str) -> String {
        self.keys_of(master, prefix, 1).remove(0)
    }
}

/// Whether the server at `addr` (a master, or a replica: `READONLY` first) has `key`.
pub fn has_key(addr: SocketAddr, key: &[u8]) -> bool {
    let got = redlock_mux_kit::probe::cmds(addr, &[&[b"READONLY"], &[b"GET", key]]);
    matches!(&got[1], Value::Bulk(Some(_)))
}

/// Whether the server at `addr` says it is a master.
pub fn is_master(addr: SocketAddr) -> bool {
    match cmd(addr, &[b"ROLE"]) {
        Value::Array(Some(items)) => {
            matches!(items.first(), Some(Value::Bulk(Some(r))) if r == b"master")
        }
        _ => false,
    }
}

/// Asserts a simple-string reply (`OK`).
pub fn ok(v: Value) {
    assert!(matches!(v, Value::Simple(_)), "{v:?}");
}

/// `CLUSTER SHARDS` of the server at `addr`: the IP it gives for the master at `port`.
pub fn announced_ip(addr: SocketAddr, port: u16) -> Option<String> {
    let Value::Array(Some(shards)) = cmd(addr, &[b"CLUSTER", b"SHARDS"]) else {
        return None;
    };
    for shard in shards {
        let Value::Array(Some(fields)) = shard else {
            continue;
        };
        for pair in fields.chunks(2) {
            let [Value::Bulk(Some(name)), Value::Array(Some(nodes))] = pair else {
                continue;
            };
            if name != b"nodes" {
                continue;
            }
            for node in nodes {
                let Value::Array(Some(f)) = node else {
                    continue;
                };
                let mut ip = None;
                let mut p = None;
                for kv in f.chunks(2) {
                    match kv {
                        [Value::Bulk(Some(k)), Value::Bulk(Some(v))] if k == b"ip" => {
                            ip = Some(String::from_utf8_lossy(v).into_owned())
                        }
                        [Value::Bulk(Some(k)), Value::Integer(v)] if k == b"port" => p = Some(*v),
                        _ => {}
                    }
                }
                if p == Some(i64::from(port)) {
                    return ip;
                }
            }
        }
    }
    None
}

/// Makes the master at `master` listen on (and announce) `ip` as well as 127.0.0.1, and waits
/// until the cluster gives that address for it.
pub fn move_to(master: SocketAddr, ip: &str) {
    ok(cmd(
        master,
        &[
            b"CONFIG",
            b"SET",
            b"bind",
            format!("127.0.0.1 {ip}").as_bytes(),
        ],
    ));
    ok(cmd(
        master,
        &[b"CONFIG", b"SET", b"cluster-announce-ip", ip.as_bytes()],
    ));
    let deadline = Instant::now() + Duration::from_secs(5);
    while announced_ip(master, master.port()).as_deref() != Some(ip) {
        assert!(Instant::now() < deadline, "{ip} not announced in 5 s");
        thread::sleep(Duration::from_millis(10));
    }
}
