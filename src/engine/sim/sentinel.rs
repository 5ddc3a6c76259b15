//! Quorum members that are masters managed by Redis Sentinel, as the simulation runs them.
//!
//! A Sentinel member is a master with one or two replicas and three sentinels, every one of
//! them a server process of its own (`127.0.0.1:7000 + n` for process `n`), which the endpoint
//! reaches through its own Sentinel code: its URL names the sentinels and the service, it asks
//! them in turn `SENTINEL get-master-addr-by-name`, checks `ROLE` on every connection to the
//! master, subscribes to `+switch-master` on one sentinel, and asks again on `READONLY`, a
//! broken connection or a `ROLE` that says `slave`. What the member's processes answer beyond
//! the data (see [`World::sentinel_gate`]), as Redis 7 and 8 do:
//!
//! - a sentinel: `SENTINEL get-master-addr-by-name SERVICE` names the master it knows of (a
//!   two-element array of address and port; a null array for a service it does not monitor);
//!   `SUBSCRIBE +switch-master`, and after a failover a `+switch-master` message
//!   `SERVICE old-ip old-port new-ip new-port`;
//! - the master: `ROLE` (`master`, with its replicas), `WAIT n ms` (how many replicas have
//!   every write so far: each replica that is up catches up, or not);
//! - a replica: `ROLE` (`slave`, with its master), `READONLY` to every write (a script fails
//!   at its first write call), `WAIT` refused.
//!
//! A member's processes share one clock (its hosts kept in step; expiry times are replicated
//! as absolute times). Replicas catch up with the master every few ms (asynchronous
//! replication). Faults of a member: a failover (the master crashes and its replica is
//! promoted a while later, or the master is demoted in place, its connections kept, and
//! answers `READONLY` from then on), sentinels whose view lags behind a failover (they name the
//! old master for a while), `+switch-master` messages lost, old masters coming back as
//! replicas (their data resynced from the new master), sentinels and replicas down.
//!
//! Within the model ([`Scenario::SentinelModel`], `?wait=1` on every Sentinel member: a grant
//! counts only once `WAIT` says a replica has it), a failover promotes the replica that caught
//! up last, which has every grant that counted; it loses what the master wrote since (grants
//! that did not count, releases). [`Scenario::SentinelLossy`] breaks the assumption: no
//! `?wait`, replicas far behind, promoted at once on any member.

use super::cluster::{port, Place};
use super::*;

/// Sentinels per member.
const SENTINELS: usize = 3;
/// The service the sentinels monitor each member's master under.
const SERVICE: &str = "sim-master";

/// A Sentinel member's state: its processes and what its sentinels know.
#[derive(Debug)]
pub(super) struct Watched {
    /// The process that is the master (down while a failover is under way).
    pub master: usize,
    /// Every other data process: replicas, and the old masters (down until they rejoin).
    replicas: Vec<usize>,
    /// The sentinel processes, in the URL's order.
    sentinels: Vec<usize>,
    /// Since when each data process has every write the master made up to then; `None`: it
    /// lost its data (down, or back empty).
    synced: BTreeMap<usize, Option<u64>>,
    /// A failover is under way: the master is gone, this replica not promoted yet.
    failing: Option<usize>,
    /// The process each sentinel names as the master.
    views: Vec<usize>,
}

impl Watched {
    /// No failover under way, and every sentinel names the master.
    pub fn quiet(&self, _now: u64) -> bool {
        self.failing.is_none() && self.views.iter().all(|&v| v == self.master)
    }
}

/// What happens to a Sentinel member, scheduled.
#[derive(Debug)]
pub(super) enum Event {
    /// The replicas catch up with the master.
    Replicate { member: usize },
    /// The replica `to` is promoted, the failed master's place taken.
    Promote { member: usize, to: usize },
    /// The old master `node` comes back, as a replica of the new one.
    Rejoin { member: usize, node: usize },
    /// Sentinel `sentinel` (by its number in the URL) learns of the master at last.
    CatchUp { member: usize, sentinel: usize },
}

impl Settings {
    /// In the Sentinel scenarios, which members are Sentinel-managed and with how many
    /// replicas, drawn from a generator of their own (as [`Settings::versions`]): in half the
    /// seeds of [`Scenario::SentinelModel`] a mix of Sentinel members and standalone servers,
    /// else Sentinel members only.
    pub(super) fn sentinels(&mut self, seed: u64, scenario: Scenario) {
        self.replicas = vec![0; self.nodes];
        if !matches!(scenario, Scenario::SentinelModel | Scenario::SentinelLossy) {
            return;
        }
        let mut rng = Rng::new(seed ^ 0x5e47_1e15_5e47_1e15);
        let all = scenario == Scenario::SentinelLossy || rng.chance(0.5);
        while self.replicas.iter().all(|&r| r == 0) {
            for m in 0..self.nodes {
                self.replicas[m] = if all || rng.chance(0.5) {
                    1 + usize::from(rng.chance(0.3))
                } else {
                    0
                };
            }
        }
        self.wait = u32::from(scenario == Scenario::SentinelModel);
        // Replicas lag by up to a TTL; far behind where the failovers lose grants.
        self.replication = if scenario == Scenario::SentinelLossy {
            rng.range(self.ttl_ms / 2, 2 * self.ttl_ms) * MS
        } else {
            rng.range(MS, self.ttl_ms * MS)
        };
    }
}

/// Adds each Sentinel member's replicas and sentinels to the run's processes, after the rest.
pub(super) fn layout(p: &Settings, layout: &mut Vec<Place>) {
    for m in 0..p.nodes {
        for _ in 0..p.replicas[m] + if p.replicas[m] > 0 { SENTINELS } else { 0 } {
            layout.push(Place {
                member: m,
                shard: None,
            });
        }
    }
}

/// The processes of member `m`: its master first, then its replicas, then its sentinels.
fn processes(layout: &[Place], m: usize) -> Vec<usize> {
    (0..layout.len())
        .filter(|&n| layout[n].member == m)
        .collect()
}

/// The URL of Sentinel member `m`: its sentinels, its service, the master's credentials
/// (`auth`), its database and `?wait`.
pub(super) fn url(p: &Settings, layout: &[Place], m: usize, auth: &str) -> NodeAddr {
    let procs = processes(layout, m);
    let hosts: Vec<String> = procs[procs.len() - SENTINELS..]
        .iter()
        .map(|&n| format!("127.0.0.1:{}", port(n)))
        .collect();
    let mut query = Vec::new();
    if p.db != 0 {
        query.push(format!("db={}", p.db));
    }
    if p.wait > 0 {
        query.push(format!("wait={}", p.wait));
    }
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    let url = format!(
        "redis+sentinel://{auth}{}/{SERVICE}{query}",
        hosts.join(",")
    );
    NodeAddr::parse(&url).expect("a Sentinel address")
}

/// Every Sentinel member's state, with its processes placed and sharing the clock of its
/// master; its sentinels without a password (theirs is apart from the data nodes').
pub(super) fn build(p: &Settings, layout: &[Place], nodes: &mut [SimNode]) -> Vec<Option<Watched>> {
    let mut out = Vec::new();
    for m in 0..p.nodes {
        let r = p.replicas[m];
        if r == 0 {
            out.push(None);
            continue;
        }
        let procs = processes(layout, m);
        let (offset, ppm) = (nodes[m].offset, nodes[m].ppm);
        for &n in &procs {
            nodes[n].place = Some(layout[n]);
            nodes[n].offset = offset;
            nodes[n].ppm = ppm;
        }
        let replicas = procs[1..=r].to_vec();
        let sentinels = procs[1 + r..].to_vec();
        for &s in &sentinels {
            nodes[s].server.password = None;
            nodes[s].service = 0;
        }
        for &n in &replicas {
            nodes[n].server.refusal = Some(Refusal::ReadOnly);
        }
        out.push(Some(Watched {
            master: procs[0],
            synced: replicas.iter().map(|&n| (n, Some(0))).collect(),
            replicas,
            views: vec![procs[0]; SENTINELS],
            sentinels,
            failing: None,
        }));
    }
    out
}

/// The words of a command.
fn words(command: &[u8]) -> Vec<Vec<u8>> {
    let Ok(resp::Status::Complete((resp::Reply::Array(Some(items)), _))) =
        resp::decode(command, &Limits::default())
    else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|r| match r {
            resp::Reply::Bulk(Some(b)) => Some(b.to_vec()),
            _ => None,
        })
        .collect()
}

/// A bulk string, as RESP writes it.
fn bulk(out: &mut String, s: &str) {
    out.push_str(&format!("${}\r\n{s}\r\n", s.len()));
}

/// What a master answers to `ROLE`, its replicas up at `replicas` (offsets 0).
pub(super) fn role_master(replicas: &[u16]) -> Vec<u8> {
    let mut out = format!("*3\r\n$6\r\nmaster\r\n:0\r\n*{}\r\n", replicas.len());
    for r in replicas {
        out.push_str("*3\r\n");
        bulk(&mut out, "127.0.0.1");
        bulk(&mut out, &r.to_string());
        bulk(&mut out, "0");
    }
    out.into_bytes()
}

/// What a replica of the master at `master` answers to `ROLE` (offset 0).
pub(super) fn role_replica(master: u16) -> Vec<u8> {
    let mut out = "*5\r\n".to_owned();
    bulk(&mut out, "slave");
    bulk(&mut out, "127.0.0.1");
    out.push_str(&format!(":{master}\r\n"));
    bulk(&mut out, "connected");
    out.push_str(":0\r\n");
    out.into_bytes()
}

/// What a sentinel answers to `SENTINEL get-master-addr-by-name` for a master at `port`
/// (`None`: a service it does not monitor).
pub(super) fn master_addr(port: Option<u16>) -> Vec<u8> {
    let Some(port) = port else {
        return b"*-1\r\n".to_vec();
    };
    let mut out = "*2\r\n".to_owned();
    bulk(&mut out, "127.0.0.1");
    bulk(&mut out, &port.to_string());
    out.into_bytes()
}

/// What a replica answers to `WAIT`.
pub(super) const WAIT_ON_REPLICA: &[u8] =
    b"-ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 \
      if a replica is configured to be writable (which is not the default) writes to replicas \
      are just local and are not propagated.\r\n";

/// The message a sentinel publishes on `+switch-master` when `service`'s master moves from
/// port `old` to port `new`.
pub(super) fn switch_payload(service: &str, old: u16, new: u16) -> String {
    format!("{service} 127.0.0.1 {old} 127.0.0.1 {new}")
}

impl World<'_> {
    /// Member `m`'s state, if it is a Sentinel member.
    fn watched(&self, node: usize) -> Option<(usize, &Watched)> {
        let place = self.nodes[node].place?;
        if place.shard.is_some() {
            return None;
        }
        Some((place.member, self.sentinels[place.member].as_ref()?))
    }

    /// Whether process `node` is a replica (or an old master) of a Sentinel member.
    pub(super) fn is_sentinel_replica(&self, node: usize) -> bool {
        self.watched(node)
            .is_some_and(|(_, w)| w.replicas.contains(&node))
    }

    /// Replication starts on every Sentinel member.
    pub(super) fn start_sentinels(&mut self) {
        let mut first = true;
        for m in 0..self.sentinels.len() {
            if self.sentinels[m].is_some() {
                self.stats.sentinel_runs += u64::from(first);
                first = false;
                let at = self.rng.range(0, self.p.replication);
                self.schedule(at, Ev::Sentinel(Event::Replicate { member: m }));
            }
        }
    }

    pub(super) fn sentinel_event(&mut self, e: Event) {
        match e {
            Event::Replicate { member } => {
                let replicas = self.sentinels[member]
                    .as_ref()
                    .map_or(Vec::new(), |w| w.replicas.clone());
                for r in replicas {
                    self.sentinel_catch_up(member, r);
                }
                if !self.clients.iter().all(|c| c.closed) {
                    let next = self.p.replication;
                    self.schedule(next, Ev::Sentinel(Event::Replicate { member }));
                }
            }
            Event::Promote { member, to } => self.sentinel_promote(member, to),
            Event::Rejoin { member, node } => self.sentinel_rejoin(member, node),
            Event::CatchUp { member, sentinel } => {
                let Some(w) = self.sentinels[member].as_mut() else {
                    return;
                };
                let (old, master) = (w.views[sentinel], w.master);
                w.views[sentinel] = master;
                if old != master {
                    self.log(format_args!(
                        "member {member}: sentinel {sentinel} names node {master} at last"
                    ));
                    self.switch_master(member, sentinel, old, master);
                }
            }
        }
    }

    /// Replica `r` of member `m` gets every write its master made so far, if both are up.
    fn sentinel_catch_up(&mut self, m: usize, r: usize) -> bool {
        let Some(w) = self.sentinels[m].as_ref() else {
            return false;
        };
        let a = w.master;
        if w.failing.is_some()
            || !self.nodes[a].up
            || !self.nodes[r].up
            || self.nodes[a].server.loading
        {
            return false;
        }
        let copy = self.nodes[a].server.node.replica();
        self.nodes[r].server.node = copy;
        let now = self.now;
        if let Some(w) = self.sentinels[m].as_mut() {
            w.synced.insert(r, Some(now));
        }
        true
    }

    /// What a Sentinel member's process answers before a command reaches its data (see the
    /// module docs); `None`: it runs.
    pub(super) fn sentinel_gate(
        &mut self,
        node: usize,
        sock: usize,
        command: &[u8],
        name: &[u8],
    ) -> Option<Vec<u8>> {
        let (m, w) = self.watched(node)?;
        if let Some(i) = w.sentinels.iter().position(|&s| s == node) {
            return self.sentinel_answer(m, i, command, name);
        }
        let master = w.master == node;
        let replicas = w.replicas.clone();
        let master_port = port(w.master);
        let authed =
            self.nodes[node].server.password.is_none() || self.socks[sock].session.authed();
        if matches!(name, b"ROLE" | b"WAIT") && !authed {
            return Some(b"-NOAUTH Authentication required.\r\n".to_vec());
        }
        match name {
            b"ROLE" if master => {
                let up: Vec<u16> = replicas
                    .iter()
                    .filter(|&&r| self.nodes[r].up)
                    .map(|&r| port(r))
                    .collect();
                Some(role_master(&up))
            }
            b"ROLE" => {
                self.stats.replica_roles += 1;
                Some(role_replica(master_port))
            }
            b"WAIT" if master => {
                let mut reached = 0;
                for r in replicas {
                    if self.nodes[r].up && self.rng.chance(0.8) && self.sentinel_catch_up(m, r) {
                        reached += 1;
                    }
                }
                self.stats.waits += 1;
                self.stats.waits_reached += u64::from(reached > 0);
                Some(format!(":{reached}\r\n").into_bytes())
            }
            b"WAIT" => Some(WAIT_ON_REPLICA.to_vec()),
            _ => {
                if !master {
                    // A replica refuses writes, whatever a fault did to it.
                    self.nodes[node].server.refusal = Some(Refusal::ReadOnly);
                }
                None
            }
        }
    }

    /// What sentinel `i` of member `m` answers; `None`: the server's own handling (`AUTH`,
    /// subscriptions).
    fn sentinel_answer(
        &mut self,
        m: usize,
        i: usize,
        command: &[u8],
        name: &[u8],
    ) -> Option<Vec<u8>> {
        let w = self.sentinels[m].as_ref()?;
        match name {
            b"SENTINEL" => {
                let words = words(command);
                let sub = words.get(1).map(|s| s.to_ascii_lowercase());
                if sub.as_deref() != Some(b"get-master-addr-by-name".as_slice()) {
                    return Some(b"-ERR Unknown sentinel subcommand\r\n".to_vec());
                }
                if words.get(2).map(Vec::as_slice) != Some(SERVICE.as_bytes()) {
                    return Some(master_addr(None));
                }
                let view = w.views[i];
                self.stats.sentinel_questions += 1;
                self.stats.stale_answers += u64::from(view != w.master);
                Some(master_addr(Some(port(view))))
            }
            b"AUTH" | b"SUBSCRIBE" | b"UNSUBSCRIBE" | b"PING" => None,
            other => {
                self.failures.push(format!(
                    "{} reached a sentinel of member {m}",
                    String::from_utf8_lossy(other)
                ));
                Some(b"-ERR unknown command\r\n".to_vec())
            }
        }
    }

    /// Sentinel `i` of member `m` announces that the master moved from `old` to `new`: each
    /// connection subscribed to `+switch-master` on it hears it, unless the message is lost.
    fn switch_master(&mut self, m: usize, i: usize, old: usize, new: usize) {
        let Some(w) = self.sentinels[m].as_ref() else {
            return;
        };
        let s = w.sentinels[i];
        if !self.nodes[s].up {
            return;
        }
        let payload = switch_payload(SERVICE, port(old), port(new));
        let incarnation = self.nodes[s].incarnation;
        for sock in 0..self.socks.len() {
            let k = &self.socks[sock];
            if k.server != s
                || !k.id.sub
                || !k.server_open
                || k.accepted != Some(incarnation)
                || !k.session.channels.contains(b"+switch-master".as_slice())
            {
                continue;
            }
            if self.rng.chance(0.3) {
                self.stats.lost_switches += 1;
                continue;
            }
            self.stats.switches += 1;
            let push = message_push(b"+switch-master", payload.as_bytes(), false);
            self.send_to_client(sock, Back::Data(push));
        }
    }

    /// A Sentinel fault: a failover (the master crashes, or is demoted in place), a sentinel
    /// down, or a replica down.
    pub(super) fn sentinel_fault(&mut self) {
        let members: Vec<usize> = (0..self.sentinels.len())
            .filter(|&m| {
                self.sentinels[m]
                    .as_ref()
                    .is_some_and(|w| w.failing.is_none())
            })
            .collect();
        if members.is_empty() {
            return;
        }
        let m = members[self.rng.below(members.len() as u64) as usize];
        let lossy = self.scenario == Scenario::SentinelLossy;
        let what = if lossy { 0 } else { self.rng.below(10) };
        let Some(w) = self.sentinels[m].as_ref() else {
            return;
        };
        match what {
            0..=5 => {
                let crash = self.rng.chance(0.5);
                self.sentinel_failover(m, crash);
            }
            6..=8 => {
                let s = w.sentinels[self.rng.below(SENTINELS as u64) as usize];
                self.crash(s);
            }
            _ => {
                let r = w.replicas[self.rng.below(w.replicas.len() as u64) as usize];
                self.crash(r);
            }
        }
    }

    /// Member `m`'s master fails over to a replica: `crash`, it crashes and the replica is
    /// promoted a while later; else it is demoted in place (its connections stay, and it
    /// answers `READONLY` from then on) as the replica is promoted. Within the model, the
    /// replica promoted is the one that caught up last (which has every grant that counted),
    /// and there is none while it is down; in [`Scenario::SentinelLossy`], any replica.
    fn sentinel_failover(&mut self, m: usize, crash: bool) {
        let Some(w) = self.sentinels[m].as_ref() else {
            return;
        };
        let a = w.master;
        if w.failing.is_some() || !self.nodes[a].up {
            return;
        }
        let up: Vec<usize> = w
            .replicas
            .iter()
            .copied()
            .filter(|&r| self.nodes[r].up && w.synced.get(&r).copied().flatten().is_some())
            .collect();
        if up.is_empty() {
            return;
        }
        let b = if self.scenario == Scenario::SentinelLossy {
            up[self.rng.below(up.len() as u64) as usize]
        } else {
            let Some(&best) = w
                .replicas
                .iter()
                .max_by_key(|&&r| w.synced.get(&r).copied().flatten())
            else {
                return;
            };
            if !up.contains(&best) {
                return;
            }
            best
        };
        let now_ms = self.nodes[a].clock_ms(self.now);
        self.nodes[a].server.node.live_keys_at(now_ms);
        self.nodes[b].server.node.live_keys_at(now_ms);
        let same = self.nodes[a]
            .server
            .node
            .same_data(&self.nodes[b].server.node);
        self.stats.failovers += 1;
        self.stats.lossy_failovers += u64::from(!same);
        if !crash {
            self.stats.demotions += 1;
            self.log(format_args!(
                "member {m}: master {a} is demoted in place; replica {b} is promoted"
            ));
            return self.sentinel_promote(m, b);
        }
        self.kill(a);
        if let Some(w) = self.sentinels[m].as_mut() {
            w.failing = Some(b);
        }
        let after = if self.scenario == Scenario::SentinelLossy {
            self.rng.range(0, self.p.ttl_ms * MS / 2)
        } else {
            self.rng.range(0, 2 * self.p.ttl_ms * MS)
        };
        self.log(format_args!(
            "member {m}: master {a} fails; replica {b} is promoted in {after} ns"
        ));
        self.schedule(after, Ev::Sentinel(Event::Promote { member: m, to: b }));
    }

    /// Replica `b` of member `m` is its master now; every other replica up resyncs from it
    /// (the old master too, if it is up: demoted in place); the sentinels name it (some only a
    /// while later) and announce it, and an old master that is down comes back later.
    fn sentinel_promote(&mut self, m: usize, b: usize) {
        let Some(w) = self.sentinels[m].as_mut() else {
            return;
        };
        let a = w.master;
        w.master = b;
        w.failing = None;
        w.replicas.retain(|&r| r != b);
        if !w.replicas.contains(&a) {
            w.replicas.push(a);
        }
        w.synced.remove(&b);
        w.synced.insert(a, None);
        let replicas = w.replicas.clone();
        self.nodes[b].server.refusal = None;
        self.log(format_args!("member {m}: node {b} is promoted"));
        for r in replicas {
            self.nodes[r].server.refusal = Some(Refusal::ReadOnly);
            if !self.sentinel_catch_up(m, r) {
                if let Some(w) = self.sentinels[m].as_mut() {
                    w.synced.insert(r, None);
                }
            }
        }
        let max_ttl = 2 * self.p.ttl_ms * MS;
        for i in 0..SENTINELS {
            let Some(w) = self.sentinels[m].as_mut() else {
                return;
            };
            let s = w.sentinels[i];
            let old = w.views[i];
            if self.nodes[s].up && self.rng.chance(0.3) {
                // This sentinel learns of the failover only a while later.
                let lag = self.rng.range(0, max_ttl);
                self.schedule(
                    lag,
                    Ev::Sentinel(Event::CatchUp {
                        member: m,
                        sentinel: i,
                    }),
                );
                continue;
            }
            w.views[i] = b;
            if old != b {
                self.switch_master(m, i, old, b);
            }
        }
        if !self.nodes[a].up {
            let back = self.rng.range(max_ttl / 4, max_ttl);
            self.schedule(back, Ev::Sentinel(Event::Rejoin { member: m, node: a }));
        }
    }

    /// Member `m`'s old master `a` restarts, as a replica of the new one (its data resynced).
    fn sentinel_rejoin(&mut self, m: usize, a: usize) {
        if self.nodes[a].up {
            return;
        }
        let id = run_id(&mut self.rng);
        let n = &mut self.nodes[a];
        n.up = true;
        n.server.run_id = id;
        n.server.loading = false;
        n.server.refusal = Some(Refusal::ReadOnly);
        n.server.node = node_memory();
        self.stats.rejoins += 1;
        self.log(format_args!("member {m}: node {a} is back, a replica"));
        self.sentinel_catch_up(m, a);
    }

    /// A crash of process `node`, if it is a Sentinel member's: its master's is a failover
    /// (`true`: done); the replica a failover is promoting stays up (`true`: nothing happens);
    /// a replica loses its data; a sentinel goes down (`false`: the crash goes on).
    pub(super) fn sentinel_crash(&mut self, node: usize) -> bool {
        let Some((m, w)) = self.watched(node) else {
            return false;
        };
        if w.master == node {
            if w.failing.is_none() {
                self.sentinel_failover(m, true);
            }
            return true;
        }
        if w.failing == Some(node) {
            return true;
        }
        if w.sentinels.contains(&node) {
            self.stats.sentinels_down += 1;
            self.log(format_args!("member {m}: sentinel {node} goes down"));
            return false;
        }
        if let Some(w) = self.sentinels[m].as_mut() {
            w.synced.insert(node, None);
        }
        false
    }

    /// Process `node` restarted: a Sentinel member's replica resyncs from the master (or stays
    /// empty while there is none); a sentinel names the master.
    pub(super) fn sentinel_restarted(&mut self, node: usize) {
        let Some((m, w)) = self.watched(node) else {
            return;
        };
        if let Some(i) = w.sentinels.iter().position(|&s| s == node) {
            let master = w.master;
            if let Some(w) = self.sentinels[m].as_mut() {
                w.views[i] = master;
            }
            return;
        }
        if w.master == node {
            return;
        }
        self.nodes[node].server.refusal = Some(Refusal::ReadOnly);
        if !self.sentinel_catch_up(m, node) {
            self.nodes[node].server.node = node_memory();
            if let Some(w) = self.sentinels[m].as_mut() {
                w.synced.insert(node, None);
            }
        }
    }
}
