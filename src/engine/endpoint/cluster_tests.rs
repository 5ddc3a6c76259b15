//! A cluster member's routing, driven by hand: the topology read (and its older form), commands
//! sent to the master of their slot, `MOVED` and `ASK` followed, a slot without a master; wake
//! channels subscribed to on the master of their slot, following `MOVED` and the
//! `sunsubscribe` of a slot that left its master.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cluster::key_slot;
use super::*;
use crate::config::{Config, RwPolicy};
use crate::engine::keys;
use crate::engine::machine::{Tag, Transmit, What};
use crate::engine::ops::{ScriptForm, SCRIPTS};
use crate::resp::{self, Limits};
use crate::rng::{Jitter, Token};
use crate::url::NodeAddr;

mod links;

const MS: Duration = Duration::from_millis(1);

fn config(url: &str) -> Arc<Config> {
    Arc::new(Config {
        nodes: vec![NodeAddr::parse(url).unwrap()],
        node_timeout: 50 * MS,
        connect_timeout: 100 * MS,
        dead_peer_timeout: Duration::from_secs(3),
        retry_count: 0,
        retry_delay: 10 * MS,
        wait_timeout: Duration::from_secs(1),
        drift_factor: 0.01,
        fair: false,
        fair_after: Duration::ZERO,
        limits: Limits::default(),
        rw_policy: RwPolicy::ReadPreferring,
        masters: Default::default(),
    })
}

/// Sends `SET key v` to every member and records what comes back.
struct Keyed {
    key: &'static [u8],
    sent: bool,
    replies: Vec<String>,
    failures: Vec<NodeErrorKind>,
}

impl Keyed {
    fn new(key: &'static [u8]) -> Keyed {
        Keyed {
            key,
            sent: false,
            replies: Vec::new(),
            failures: Vec::new(),
        }
    }
}

impl Machine for Keyed {
    type Output = ();

    fn handle_reply(
        &mut self,
        _: usize,
        _: Tag,
        reply: &Reply<'_>,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
        self.replies.push(match reply {
            Reply::Error(m) => format!("Error({})", String::from_utf8_lossy(m)),
            other => format!("{other:?}"),
        });
    }

    fn handle_failure(
        &mut self,
        _: usize,
        _: Tag,
        why: NodeErrorKind,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
        self.failures.push(why);
    }

    fn handle_timeout(&mut self, _: Instant, _: &mut dyn Entropy) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Transmit {
            to: To::All,
            tag: Some(1),
            form: ScriptForm::Sha,
            what: What::Acquire {
                token: Token::from_random([1; 20]),
            },
            redo: None,
        })
    }

    fn encode(&self, _: &Transmit, _: Caps, out: &mut Vec<u8>) -> usize {
        resp::encode_command(out, &[b"SET", self.key, b"v"]);
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<()> {
        None
    }
}

struct Net {
    ep: Endpoint,
    now: Instant,
}

fn cmd(node: usize) -> ConnId {
    ConnId { node, sub: false }
}

impl Net {
    fn new(url: &str) -> Net {
        let now = Instant::now();
        Net {
            ep: Endpoint::new(config(url), Arc::new(Recorder::new(1)), now),
            now,
        }
    }

    /// Takes every `Io::Connect`, reports them done, and returns the links connected.
    fn connect(&mut self) -> Vec<usize> {
        let mut done = Vec::new();
        while let Some(io) = self.ep.poll_io() {
            if let Io::Connect(id) = io {
                self.ep.handle_connected(id);
                done.push(id.node);
            }
        }
        done
    }

    /// The commands `link` has to write, by their words, as written.
    fn output(&mut self, link: usize) -> Vec<String> {
        self.output_of(cmd(link))
    }

    /// The commands connection `id` has to write, by their words, as written.
    fn output_of(&mut self, id: ConnId) -> Vec<String> {
        let out = self.ep.pending(id).to_vec();
        self.ep.handle_sent(id, out.len(), self.now);
        let mut rest = &out[..];
        let mut commands = Vec::new();
        while let Ok(resp::Status::Complete((Reply::Array(Some(items)), used))) =
            resp::decode(rest, &Limits::default())
        {
            let words: Vec<String> = items
                .iter()
                .map(|i| match i {
                    Reply::Bulk(Some(w)) => String::from_utf8_lossy(w).into_owned(),
                    _ => String::new(),
                })
                .collect();
            commands.push(words.join(" "));
            rest = &rest[used..];
        }
        commands
    }

    fn reply(&mut self, link: usize, bytes: &[u8]) {
        self.reply_to(cmd(link), bytes);
    }

    fn reply_to(&mut self, id: ConnId, bytes: &[u8]) {
        let buf = self.ep.recv_buf(id, self.now).expect("room");
        buf[..bytes.len()].copy_from_slice(bytes);
        self.ep.handle_recv(id, bytes.len(), self.now);
    }

    /// Takes every `Io::Connect`, reports them done, and returns the connections.
    fn connect_ids(&mut self) -> Vec<ConnId> {
        let mut done = Vec::new();
        while let Some(io) = self.ep.poll_io() {
            if let Io::Connect(id) = io {
                self.ep.handle_connected(id);
                done.push(id);
            }
        }
        done
    }

    /// Runs `m` as a new caller's operation, or as `(caller, run)`'s.
    fn run<M: Machine>(&mut self, at: Option<(CallerId, u64)>, m: &mut M) -> (CallerId, u64) {
        let (caller, run) = at.unwrap_or_else(|| {
            let caller = self.ep.open_caller();
            (caller, self.ep.begin(caller))
        });
        let mut rng = {
            use rand_core::SeedableRng;
            Jitter::from_seed([7; 32])
        };
        self.ep.step(caller, run, m, self.now, &mut rng);
        (caller, run)
    }

    /// Answers `link`'s setup as a Redis 7 server whose run id is made of `id`.
    fn answer_setup(&mut self, link: usize, id: char) {
        self.answer_setup_as(link, id, "7.0.15", false);
    }

    /// Answers `link`'s setup as a Redis `version` server, with `HSETEX` if `hsetex`.
    fn answer_setup_as(&mut self, link: usize, id: char, version: &str, hsetex: bool) {
        let mut r = Vec::new();
        // Every script, and the variant of each that announces with SPUBLISH.
        for s in SCRIPTS {
            r.extend_from_slice(b"$40\r\n0000000000000000000000000000000000000000\r\n");
            if !std::ptr::eq(s.announcing(true), *s) {
                r.extend_from_slice(b"$40\r\n0000000000000000000000000000000000000000\r\n");
            }
        }
        let text = format!(
            "redis_version:{version}\r\nrun_id:{}\r\n",
            id.to_string().repeat(40)
        );
        r.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
        if hsetex {
            r.extend_from_slice(b"*2\r\n$-1\r\n*1\r\n$6\r\nhsetex\r\n");
        } else {
            r.extend_from_slice(b"*2\r\n$-1\r\n$-1\r\n");
        }
        self.reply(link, &r);
    }

    /// Runs `m` as a new caller's operation: its caller and run.
    fn step(&mut self, m: &mut Keyed) -> (CallerId, u64) {
        let caller = self.ep.open_caller();
        let run = self.ep.begin(caller);
        let mut rng = {
            use rand_core::SeedableRng;
            Jitter::from_seed([7; 32])
        };
        self.ep.step(caller, run, m, self.now, &mut rng);
        (caller, run)
    }

    /// Delivers what the endpoint posted for `m`, run as `(caller, run)`.
    fn deliver(&mut self, (caller, run): (CallerId, u64), m: &mut Keyed) {
        let mut rng = {
            use rand_core::SeedableRng;
            Jitter::from_seed([7; 32])
        };
        self.ep.step(caller, run, m, self.now, &mut rng);
    }
}

/// `CLUSTER SLOTS`' reply: each range served by the master on 127.0.0.1 at its port.
fn slots(ranges: &[(u16, u16, u16)]) -> Vec<u8> {
    let mut r = format!("*{}\r\n", ranges.len()).into_bytes();
    for &(a, b, port) in ranges {
        r.extend_from_slice(
            format!("*3\r\n:{a}\r\n:{b}\r\n*3\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$1\r\nx\r\n")
                .as_bytes(),
        );
    }
    r
}

/// A member whose seed is set up and whose topology, read with `CLUSTER SLOTS` after the
/// server refused `CLUSTER SHARDS`, is `ranges`; the masters' links connected and set up.
fn member(ranges: &[(u16, u16, u16)]) -> Net {
    let mut net = Net::new("redis+cluster://127.0.0.1:7000");
    net.ep.connect_all(net.now);
    assert_eq!(net.connect(), [0]);
    net.output(0);
    net.answer_setup(0, 's');
    assert_eq!(net.output(0), ["CLUSTER SHARDS"], "behind the setup");
    net.reply(
        0,
        b"-ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP.\r\n",
    );
    assert_eq!(net.output(0), ["CLUSTER SLOTS"], "the older form, at once");
    net.reply(0, &slots(ranges));
    let links = net.connect();
    assert_eq!(
        links.len(),
        ranges.len(),
        "one link per master, connected at once"
    );
    for (k, &link) in links.iter().enumerate() {
        net.output(link);
        net.answer_setup(link, char::from(b'a' + k as u8));
    }
    net
}

#[test]
fn commands_go_to_the_master_of_their_slot() {
    let (a, b) = (key_slot(b"a"), key_slot(b"b"));
    assert!(b < 8192 && a >= 8192, "{a} {b}");
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    let mut ma = Keyed::new(b"a");
    net.step(&mut ma);
    let mut mb = Keyed::new(b"b");
    net.step(&mut mb);
    assert_eq!(net.output(2), ["SET a v"]);
    assert_eq!(net.output(1), ["SET b v"]);
    assert!(net.output(0).is_empty(), "nothing on the seed");
}

#[test]
fn moved_sends_the_command_to_the_new_owner_and_rereads_the_topology() {
    let a = key_slot(b"a");
    let mut net = member(&[(0, 16383, 7001)]);
    let mut m = Keyed::new(b"a");
    let run = net.step(&mut m);
    assert_eq!(net.output(1), ["SET a v"]);
    net.reply(1, format!("-MOVED {a} 127.0.0.1:7003\r\n").as_bytes());
    assert_eq!(net.connect(), [2], "a link to the new owner");
    net.output(2);
    net.answer_setup(2, 'c');
    assert_eq!(
        net.output(2),
        ["SET a v"],
        "sent again behind the new link's setup"
    );
    net.reply(2, b"+OK\r\n");
    net.deliver(run, &mut m);
    assert_eq!(
        m.replies,
        ["Simple([79, 75])"],
        "the new owner's reply is the vote"
    );
    assert!(m.failures.is_empty());
    // The map moved, and the topology is read again.
    let mut again = Keyed::new(b"a");
    net.step(&mut again);
    assert_eq!(net.output(2), ["SET a v"]);
    net.now += 200 * MS;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
}

#[test]
fn ask_sends_that_command_alone_after_asking() {
    let a = key_slot(b"a");
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    let mut m = Keyed::new(b"a");
    let run = net.step(&mut m);
    assert_eq!(net.output(2), ["SET a v"]);
    net.reply(2, format!("-ASK {a} 127.0.0.1:7001\r\n").as_bytes());
    assert_eq!(net.output(1), ["ASKING", "SET a v"]);
    net.reply(1, b"+OK\r\n+OK\r\n");
    net.deliver(run, &mut m);
    assert_eq!(m.replies, ["Simple([79, 75])"], "one reply: the command's");
    // The slot stays where it was.
    let mut again = Keyed::new(b"a");
    net.step(&mut again);
    assert_eq!(net.output(2), ["SET a v"]);
}

#[test]
fn a_slot_without_a_master_or_a_refusal_is_a_failure_never_a_vote() {
    let (a, b) = (key_slot(b"a"), key_slot(b"b"));
    let (lo, hi) = (a.min(b), a.max(b));
    let mut net = member(&[(lo, lo, 7001)]);
    let hi_key: &'static [u8] = if hi == a { b"a" } else { b"b" };
    let lo_key: &'static [u8] = if lo == a { b"a" } else { b"b" };
    let mut m = Keyed::new(hi_key);
    net.step(&mut m);
    assert!(
        matches!(
            &m.failures[..],
            [NodeErrorKind::Server {
                kind: crate::resp::ServerErrorKind::ClusterDown,
                ..
            }]
        ),
        "{:?}",
        m.failures
    );
    assert!(m.replies.is_empty());
    let mut m = Keyed::new(lo_key);
    let run = net.step(&mut m);
    assert_eq!(
        net.output(1),
        [format!("SET {} v", String::from_utf8_lossy(lo_key))]
    );
    net.reply(
        1,
        b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
    );
    net.deliver(run, &mut m);
    assert_eq!(
        m.replies,
        ["Error(TRYAGAIN Multiple keys request during rehashing of slot)"],
        "given to the machine, which counts it as a failure"
    );
}

#[test]
fn the_first_topology_read_goes_out_whatever_the_server_offers() {
    // The read waits behind the seed's first setup, before anything is known of the server;
    // a server with newer commands must not make it fail as written for another one.
    let mut net = Net::new("redis+cluster://127.0.0.1:7000");
    net.ep.connect_all(net.now);
    assert_eq!(net.connect(), [0]);
    net.output(0);
    net.answer_setup_as(0, 's', "8.2.3", true);
    assert!(net.ep.is_open(cmd(0)), "the seed's connection stays up");
    assert_eq!(net.output(0), ["CLUSTER SHARDS"]);
}

/// Subscribes to the wake channel of the mutex on `key`, as a waiter does, and records what it
/// hears.
struct Waiter {
    key: &'static [u8],
    sent: bool,
    subscribed: bool,
    wakes: Vec<(usize, String, String)>,
}

impl Waiter {
    fn new(key: &'static [u8]) -> Waiter {
        Waiter {
            key,
            sent: false,
            subscribed: false,
            wakes: Vec::new(),
        }
    }
}

impl Machine for Waiter {
    type Output = ();

    fn handle_reply(&mut self, _: usize, _: Tag, _: &Reply<'_>, _: Instant, _: &mut dyn Entropy) {}

    fn handle_failure(
        &mut self,
        _: usize,
        _: Tag,
        _: NodeErrorKind,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
    }

    fn handle_timeout(&mut self, _: Instant, _: &mut dyn Entropy) {}

    fn handle_wake(
        &mut self,
        node: usize,
        channel: &[u8],
        message: &[u8],
        _: Instant,
        _: &mut dyn Entropy,
    ) {
        self.wakes.push((
            node,
            String::from_utf8_lossy(channel).into_owned(),
            String::from_utf8_lossy(message).into_owned(),
        ));
    }

    fn handle_subscribed(&mut self, _: Instant, _: &mut dyn Entropy) {
        self.subscribed = true;
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Transmit {
            to: To::Subscribers,
            tag: None,
            form: ScriptForm::Body,
            what: What::Subscribe,
            redo: None,
        })
    }

    fn encode(&self, _: &Transmit, caps: Caps, out: &mut Vec<u8>) -> usize {
        let command: &[u8] = if caps.sharded {
            b"SSUBSCRIBE"
        } else {
            b"SUBSCRIBE"
        };
        let channel = keys::wake_channel_for(self.key, keys::Family::Mutex, caps.sharded);
        resp::encode_command(out, &[command, &channel.to_vec()]);
        1
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<()> {
        None
    }
}

fn sub(node: usize) -> ConnId {
    ConnId { node, sub: true }
}

/// A pub/sub message of `kind` on `channel`: `*3 $kind $channel <last>`.
fn push(kind: &str, channel: &str, last: &str) -> Vec<u8> {
    format!(
        "*3\r\n${}\r\n{kind}\r\n${}\r\n{channel}\r\n{last}\r\n",
        kind.len(),
        channel.len()
    )
    .into_bytes()
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}", s.len())
}

#[test]
fn a_wake_channel_is_subscribed_to_on_the_master_of_its_slot_alone() {
    let a = key_slot(b"a");
    assert!(a >= 8192);
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    let mut w = Waiter::new(b"a");
    let run = net.run(None, &mut w);
    assert_eq!(
        net.connect_ids(),
        [sub(2)],
        "the slot's master's subscriber only"
    );
    let ch = "redlock-mux:wake:{a}";
    assert_eq!(key_slot(ch.as_bytes()), a, "in the lock's slot");
    assert_eq!(net.output_of(sub(2)), [format!("SSUBSCRIBE {ch}")]);
    net.run(Some(run), &mut w);
    assert!(!w.subscribed, "not before the master confirms");
    net.reply_to(sub(2), &push("ssubscribe", ch, ":1"));
    net.run(Some(run), &mut w);
    assert!(w.subscribed);
    net.reply_to(sub(2), &push("smessage", ch, &bulk("0123456789abcdef")));
    net.run(Some(run), &mut w);
    assert_eq!(
        w.wakes,
        [(0, ch.to_owned(), "0123456789abcdef".to_owned())],
        "heard as the member's"
    );
    // The last caller gone, the channel is left; the master's confirmation of that is no
    // reason to subscribe again.
    net.ep.finish(run.0, run.1, net.now);
    assert_eq!(net.output_of(sub(2)), [format!("SUNSUBSCRIBE {ch}")]);
    net.reply_to(sub(2), &push("sunsubscribe", ch, ":0"));
    assert!(net.output_of(sub(2)).is_empty());
    assert!(net.output_of(sub(1)).is_empty());
}

#[test]
fn moved_on_ssubscribe_subscribes_at_the_master_named() {
    let a = key_slot(b"a");
    let mut net = member(&[(0, 16383, 7001)]);
    let mut w = Waiter::new(b"a");
    let run = net.run(None, &mut w);
    assert_eq!(net.connect_ids(), [sub(1)]);
    let ch = "redlock-mux:wake:{a}";
    assert_eq!(net.output_of(sub(1)), [format!("SSUBSCRIBE {ch}")]);
    net.reply_to(sub(1), format!("-MOVED {a} 127.0.0.1:7003\r\n").as_bytes());
    assert_eq!(net.connect_ids(), [sub(2)], "the new owner's subscriber");
    assert_eq!(net.output_of(sub(2)), [format!("SSUBSCRIBE {ch}")]);
    net.run(Some(run), &mut w);
    assert!(!w.subscribed, "waits for the new owner's confirmation");
    net.reply_to(sub(2), &push("ssubscribe", ch, ":1"));
    net.run(Some(run), &mut w);
    assert!(w.subscribed);
    net.reply_to(sub(2), &push("smessage", ch, &bulk("t")));
    net.run(Some(run), &mut w);
    assert_eq!(w.wakes.len(), 1);
    // The slot moved in the map (a command goes there), and the topology is read again.
    let mut m = Keyed::new(b"a");
    net.step(&mut m);
    net.connect_ids();
    net.output(2);
    net.answer_setup(2, 'c');
    assert_eq!(net.output(2), ["SET a v"]);
    net.now += 200 * MS;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
}

#[test]
fn a_slot_that_leaves_its_master_is_subscribed_to_at_its_new_owner() {
    let a = key_slot(b"a");
    let mut net = member(&[(0, 16383, 7001)]);
    let mut w = Waiter::new(b"a");
    let run = net.run(None, &mut w);
    net.connect_ids();
    let ch = "redlock-mux:wake:{a}";
    assert_eq!(net.output_of(sub(1)), [format!("SSUBSCRIBE {ch}")]);
    net.reply_to(sub(1), &push("ssubscribe", ch, ":1"));
    net.run(Some(run), &mut w);
    assert!(w.subscribed);
    // The slot migrated: the master drops the subscription with a push of its own.
    net.reply_to(sub(1), &push("sunsubscribe", ch, ":0"));
    assert_eq!(
        net.output_of(sub(1)),
        [format!("SSUBSCRIBE {ch}")],
        "at once where the map says, which answers where the slot went"
    );
    net.reply_to(sub(1), format!("-MOVED {a} 127.0.0.1:7003\r\n").as_bytes());
    assert_eq!(net.connect_ids(), [sub(2)]);
    assert_eq!(net.output_of(sub(2)), [format!("SSUBSCRIBE {ch}")]);
    net.reply_to(sub(2), &push("ssubscribe", ch, ":1"));
    net.reply_to(sub(2), &push("smessage", ch, &bulk("t")));
    net.run(Some(run), &mut w);
    assert_eq!(w.wakes.len(), 1, "heard from the new owner");
    // The topology read that the move asked for names the new owner: nothing changes.
    net.now += 200 * MS;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
    net.reply(0, &slots(&[(0, 16383, 7003)]));
    assert!(net.output_of(sub(2)).is_empty());
    assert!(net.output_of(sub(1)).is_empty());
}

#[test]
fn a_topology_read_moves_subscriptions_to_the_masters_it_names() {
    let mut net = member(&[(0, 16383, 7001)]);
    let mut w = Waiter::new(b"a");
    let run = net.run(None, &mut w);
    net.connect_ids();
    let ch = "redlock-mux:wake:{a}";
    assert_eq!(net.output_of(sub(1)), [format!("SSUBSCRIBE {ch}")]);
    net.reply_to(sub(1), &push("ssubscribe", ch, ":1"));
    net.run(Some(run), &mut w);
    // A periodic read finds the slot elsewhere (a failover, say): the subscription follows.
    net.now += cluster::REFRESH_PERIOD;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
    net.reply(0, &slots(&[(0, 16383, 7003)]));
    assert_eq!(net.output_of(sub(1)), [format!("SUNSUBSCRIBE {ch}")]);
    let ids = net.connect_ids();
    assert!(ids.contains(&sub(2)), "{ids:?}");
    assert_eq!(net.output_of(sub(2)), [format!("SSUBSCRIBE {ch}")]);
}

#[test]
fn a_masters_setup_loads_the_scripts_that_announce_with_spublish() {
    let mut net = Net::new("redis+cluster://127.0.0.1:7000");
    net.ep.connect_all(net.now);
    net.connect();
    let setup = net.output(0);
    let loads: Vec<&String> = setup
        .iter()
        .filter(|c| c.starts_with("SCRIPT LOAD"))
        .collect();
    let sharded = SCRIPTS
        .iter()
        .filter(|s| !std::ptr::eq(s.announcing(true), **s))
        .count();
    assert_eq!(sharded, 9);
    assert_eq!(loads.len(), SCRIPTS.len() + sharded);
    assert_eq!(
        loads.iter().filter(|c| c.contains("'spublish'")).count(),
        sharded
    );
    // A standalone member's setup is what it was.
    let mut net = Net::new("redis://127.0.0.1:6379");
    net.ep.connect_all(net.now);
    net.connect();
    let setup = net.output(0);
    assert_eq!(
        setup
            .iter()
            .filter(|c| c.starts_with("SCRIPT LOAD"))
            .count(),
        SCRIPTS.len()
    );
    assert!(!setup.iter().any(|c| c.contains("'spublish'")));
}

#[test]
fn standalone_members_subscribe_as_before() {
    let mut net = Net::new("redis://127.0.0.1:6379");
    let mut w = Waiter::new(b"a");
    let run = net.run(None, &mut w);
    assert_eq!(net.connect_ids(), [sub(0)]);
    let ch = "redlock-mux:wake:a";
    assert_eq!(net.output_of(sub(0)), [format!("SUBSCRIBE {ch}")]);
    net.reply_to(sub(0), &push("subscribe", ch, ":1"));
    net.reply_to(sub(0), &push("message", ch, &bulk("t")));
    net.run(Some(run), &mut w);
    assert!(w.subscribed);
    assert_eq!(w.wakes.len(), 1);
}

/// Sends `DEL key` to every member as a release owed until `until`, whose reply nobody reads
/// unless `tag` is set (a release's round); records the failures its owner is told of.
struct Deleting {
    key: &'static [u8],
    until: Instant,
    sent: bool,
    tag: Option<Tag>,
    failures: Vec<NodeErrorKind>,
    /// Whether the delete is written inside `MULTI` ... `EXEC`.
    multi: bool,
}

impl Deleting {
    fn new(key: &'static [u8], until: Instant) -> Deleting {
        Deleting {
            key,
            until,
            sent: false,
            tag: None,
            failures: Vec::new(),
            multi: false,
        }
    }
}

impl Machine for Deleting {
    type Output = ();

    fn handle_reply(&mut self, _: usize, _: Tag, _: &Reply<'_>, _: Instant, _: &mut dyn Entropy) {}

    fn handle_failure(
        &mut self,
        _: usize,
        _: Tag,
        why: NodeErrorKind,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
        self.failures.push(why);
    }

    fn handle_timeout(&mut self, _: Instant, _: &mut dyn Entropy) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Transmit {
            to: To::All,
            tag: self.tag,
            form: ScriptForm::Sha,
            what: What::Release {
                token: Token::from_random([1; 20]),
            },
            redo: Some(self.until),
        })
    }

    fn encode(&self, _: &Transmit, _: Caps, out: &mut Vec<u8>) -> usize {
        if !self.multi {
            resp::encode_command(out, &[b"DEL", self.key]);
            return 0;
        }
        resp::encode_command(out, &[b"MULTI"]);
        resp::encode_command(out, &[b"DEL", self.key]);
        resp::encode_command(out, &[b"EXEC"]);
        2
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<()> {
        None
    }
}

/// The master of key `a`'s slot (link 2) broke with a release owed; its reconnects are
/// refused. Moves time on by `step` `n` times: every connect of link 2 is refused, and every
/// topology read is answered with `ranges`. Stops early once `stop` says so.
fn dead_master(
    net: &mut Net,
    ranges: &[(u16, u16, u16)],
    step: Duration,
    n: usize,
    mut stop: impl FnMut(&mut Net) -> bool,
) {
    for _ in 0..n {
        net.now += step;
        net.ep.handle_timeout(net.now);
        while let Some(io) = net.ep.poll_io() {
            match io {
                Io::Connect(id) if id.node == 2 => {
                    let refused = NodeErrorKind::Connect(std::io::ErrorKind::ConnectionRefused);
                    net.ep.handle_connect_failed(id, refused, net.now);
                }
                Io::Connect(id) => net.ep.handle_connected(id),
                Io::Close(_) => {}
                Io::Probe { id, .. } => net.ep.handle_probed(id, Probed::Nothing, net.now),
                // No Sentinel member here.
                Io::Resolve { .. } => {}
            }
        }
        for link in [0, 1] {
            let pending = net.ep.pending(cmd(link)).to_vec();
            if pending.windows(5).any(|w| w == b"SLOTS") {
                net.output(link);
                net.reply(link, &slots(ranges));
            }
        }
        if stop(net) {
            return;
        }
    }
}

#[test]
fn a_delete_owed_by_a_dead_master_goes_to_the_master_its_slot_moved_to() {
    let a = key_slot(b"a");
    assert!(a >= 8192, "{a}");
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    let mut m = Deleting::new(b"a", net.now + Duration::from_secs(60));
    net.run(None, &mut m);
    assert_eq!(net.output(2), ["DEL a"]);
    net.ep.handle_failed(
        cmd(2),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    // The cluster gives link 1's master every slot (a replica of the dead one promoted to it).
    let mut sent = Vec::new();
    dead_master(&mut net, &[(0, 16383, 7001)], 100 * MS, 30, |net| {
        sent = net.output(1);
        !sent.is_empty()
    });
    assert_eq!(
        sent,
        ["DEL a"],
        "the delete goes to the master that serves its slot now"
    );
    net.reply(1, b":1\r\n");
    assert!(
        !net.ep.busy(net.now),
        "nothing left owed: {:?}",
        net.ep.undelivered(net.now)
    );
}

#[test]
fn a_delete_for_a_slot_without_a_master_goes_to_the_master_named_next() {
    let a = key_slot(b"a");
    assert!(a >= 8192, "{a}");
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    // Key a's master dies, and the cluster marks it failed: its topology names no master for
    // key a's slot while it elects the replica.
    net.ep.handle_failed(
        cmd(2),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    dead_master(&mut net, &[(0, 8191, 7001)], 100 * MS, 3, |_| false);
    // A release now: no master to send it to, a failure of the member for its round.
    let mut m = Deleting::new(b"a", net.now + Duration::from_secs(60));
    m.tag = Some(1);
    let run = net.run(None, &mut m);
    net.run(Some(run), &mut m);
    assert!(
        matches!(
            &m.failures[..],
            [NodeErrorKind::Server {
                kind: crate::resp::ServerErrorKind::ClusterDown,
                ..
            }]
        ),
        "{:?}",
        m.failures
    );
    // The seed's connection breaks and comes back meanwhile: the delete is not sent to the
    // seed (a replica, or a master that would redirect it to the dead one).
    net.ep.handle_failed(
        cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let mut seed = Vec::new();
    for _ in 0..30 {
        net.now += 50 * MS;
        net.ep.handle_timeout(net.now);
        if net.connect_ids().contains(&cmd(0)) {
            seed = net.output(0);
            break;
        }
    }
    assert!(!seed.is_empty(), "the seed reconnects");
    net.answer_setup(0, 's');
    seed.extend(net.output(0));
    seed.retain(|c| !c.starts_with("SCRIPT LOAD"));
    assert!(
        !seed.iter().any(|c| c.starts_with("DEL")),
        "nothing owed goes to the seed: {seed:?}"
    );
    if seed.iter().any(|c| c.ends_with("SLOTS")) {
        net.reply(0, &slots(&[(0, 8191, 7001)]));
    }
    // The replica is promoted (at link 1's address, which now serves every slot).
    let mut sent = Vec::new();
    dead_master(&mut net, &[(0, 16383, 7001)], 100 * MS, 30, |net| {
        sent = net.output(1);
        !sent.is_empty()
    });
    assert_eq!(
        sent,
        ["DEL a"],
        "the delete goes to the master named for its slot once there is one"
    );
    net.reply(1, b":1\r\n");
    assert!(
        !net.ep.busy(net.now),
        "nothing left owed: {:?}",
        net.ep.undelivered(net.now)
    );
}

#[test]
fn a_release_refused_clusterdown_stays_owed_and_goes_again() {
    let a = key_slot(b"a");
    assert!(a >= 8192, "{a}");
    let down = &b"-CLUSTERDOWN The cluster is down\r\n"[..];
    let aborted = &b"+OK\r\n-CLUSTERDOWN The cluster is down\r\n\
                    -EXECABORT Transaction discarded because of previous errors.\r\n"[..];
    for (multi, refusal) in [(false, down), (true, aborted)] {
        let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
        // A release's round: its master answers during a failover.
        let mut m = Deleting::new(b"a", net.now + Duration::from_secs(60));
        m.tag = Some(1);
        m.multi = multi;
        let run = net.run(None, &mut m);
        let first = net.output(2);
        assert!(first.iter().any(|c| c == "DEL a"), "{first:?}");
        net.reply(2, refusal);
        net.run(Some(run), &mut m);
        assert!(m.failures.is_empty(), "{multi}: {:?}", m.failures);
        assert_eq!(
            net.ep.undelivered(net.now),
            [0],
            "{multi}: the release stays owed"
        );
        // Sent again after a pause (a topology read answered meanwhile names the same master).
        let mut again = Vec::new();
        for _ in 0..40 {
            net.now += 10 * MS;
            net.ep.handle_timeout(net.now);
            for link in [0, 1, 2] {
                let out = net.output(link);
                if out.iter().any(|c| c.ends_with("SLOTS")) {
                    net.reply(link, &slots(&[(0, 8191, 7001), (8192, 16383, 7002)]));
                }
                if link == 2 && out.iter().any(|c| c == "DEL a") {
                    again = out;
                }
            }
            if !again.is_empty() {
                break;
            }
        }
        assert!(
            again.iter().any(|c| c == "DEL a"),
            "{multi}: the release goes again"
        );
        let ran = if multi {
            &b"+OK\r\n+QUEUED\r\n*1\r\n:1\r\n"[..]
        } else {
            b":1\r\n"
        };
        net.reply(2, ran);
        assert!(
            !net.ep.busy(net.now),
            "{multi}: nothing left owed: {:?}",
            net.ep.undelivered(net.now)
        );
    }
}

#[test]
fn closing_gives_up_when_only_topology_reads_answer() {
    let mut net = member(&[(0, 8191, 7001), (8192, 16383, 7002)]);
    let mut m = Deleting::new(b"a", net.now + Duration::from_secs(60));
    net.run(None, &mut m);
    assert_eq!(net.output(2), ["DEL a"]);
    net.ep.handle_failed(
        cmd(2),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    // No master serves key a's slot any more; the cluster answers every topology read.
    let begun = net.now;
    net.ep.begin_close(net.now);
    let mut outcome = None;
    dead_master(&mut net, &[(0, 8191, 7001)], 50 * MS, 300, |net| {
        outcome = net.ep.close_outcome(net.now);
        outcome.is_some()
    });
    let took = net.now - begun;
    assert_eq!(outcome, Some(vec![0]), "the release is undelivered");
    assert!(
        took <= CLOSE_STALL + 100 * MS,
        "closing went on {took:?} with nothing owed answered"
    );
    // A close right after (the last handle dropped) does not wait its own 10 s again.
    net.ep.begin_close(net.now);
    let again = net.now;
    let mut outcome = None;
    dead_master(&mut net, &[(0, 8191, 7001)], 50 * MS, 300, |net| {
        outcome = net.ep.close_outcome(net.now);
        outcome.is_some()
    });
    assert_eq!(outcome, Some(vec![0]));
    assert!(
        net.now - begun <= CLOSE_LIMIT,
        "the two closes took {:?} and {:?}",
        again - begun,
        net.now - again
    );
}

/// A command refused because the slot map gives its slot no master (a failover under way)
/// has the endpoint read the topology again on its own, as soon as the gap between reads
/// allows and again while the new map still gives the slot none, without waiting for the
/// next command: it asks to be tended meanwhile. Once a read names a master, it stops, and a
/// command asked for then goes to that master.
#[test]
fn a_slot_refused_for_want_of_a_master_is_read_again_until_one_serves_it() {
    let (a, b) = (key_slot(b"a"), key_slot(b"b"));
    let (lo, hi) = (a.min(b), a.max(b));
    let mut net = member(&[(lo, lo, 7001)]);
    let hi_key: &'static [u8] = if hi == a { b"a" } else { b"b" };
    let mut m = Keyed::new(hi_key);
    net.step(&mut m);
    assert_eq!(m.failures.len(), 1, "{:?}", m.failures);
    // A read was sent at the refusal (or is wanted): answer it as the failover still runs.
    net.now += cluster::REFRESH_MIN_GAP;
    net.ep.handle_timeout(net.now);
    let out = net.output(0);
    if !out.is_empty() {
        assert_eq!(out, ["CLUSTER SLOTS"]);
        net.reply(0, &slots(&[(lo, lo, 7001)]));
    }
    // No command comes; the endpoint reads again on its own.
    let mut reads = 0;
    for _ in 0..20 {
        assert!(
            net.ep.needs_tending(net.now) && net.ep.tending_urgent(net.now),
            "a slot refused for want of a master, and nobody drives the endpoint"
        );
        let due = net.ep.poll_timeout().expect("a topology read is due");
        assert!(
            due <= net.now + cluster::REFRESH_MIN_GAP,
            "the next read waits"
        );
        net.now = due.max(net.now);
        net.ep.handle_timeout(net.now);
        let out = net.output(0);
        if out.is_empty() {
            continue;
        }
        assert_eq!(out, ["CLUSTER SLOTS"]);
        reads += 1;
        if reads < 3 {
            net.reply(0, &slots(&[(lo, lo, 7001)]));
        } else {
            // The failover settled: a master serves the slot.
            net.reply(0, &slots(&[(lo, lo, 7001), (hi, hi, 7002)]));
            break;
        }
    }
    assert_eq!(
        reads, 3,
        "the topology was read again until a master served the slot"
    );
    let links = net.connect();
    assert_eq!(links.len(), 1, "the new master's link");
    net.output(links[0]);
    net.answer_setup(links[0], 'z');
    assert!(!net.ep.tending_urgent(net.now), "nothing left to chase");
    let mut m = Keyed::new(hi_key);
    net.step(&mut m);
    assert!(m.failures.is_empty(), "{:?}", m.failures);
    assert_eq!(
        net.output(links[0]),
        [format!("SET {} v", String::from_utf8_lossy(hi_key))]
    );
}
