//! A Sentinel member's endpoint, driven by hand: the sentinels asked in turn, nothing sent
//! before a master is named and has said `ROLE master`, and a release owed to the old master
//! sent to the new one after `+switch-master`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::*;
use crate::config::{Config, RwPolicy};
use crate::engine::machine::{Tag, Transmit, What};
use crate::engine::ops::{ScriptForm, SCRIPTS};
use crate::resp::{self, Limits};
use crate::rng::{Jitter, Token};
use crate::url::NodeAddr;

const MS: Duration = Duration::from_millis(1);
const URL: &str = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/svc";

/// Sends one command to the member and records what comes back.
struct One {
    what: What,
    redo: Option<Instant>,
    sent: bool,
    replies: Vec<String>,
    failures: Vec<NodeErrorKind>,
}

impl One {
    fn new(what: What, redo: Option<Instant>) -> One {
        One {
            what,
            redo,
            sent: false,
            replies: Vec::new(),
            failures: Vec::new(),
        }
    }
}

impl Machine for One {
    type Output = ();
    fn handle_reply(
        &mut self,
        _: usize,
        _: Tag,
        reply: &Reply<'_>,
        _: Instant,
        _: &mut dyn Entropy,
    ) {
        self.replies.push(format!("{reply:?}"));
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
            what: self.what,
            redo: self.redo,
        })
    }
    fn encode(&self, _: &Transmit, _: Caps, out: &mut Vec<u8>) -> usize {
        resp::encode_command(out, &[b"MINE"]);
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

impl Net {
    fn new() -> Net {
        let now = Instant::now();
        let config = Arc::new(Config {
            nodes: vec![NodeAddr::parse(URL).unwrap()],
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
        });
        Net {
            ep: Endpoint::new(config, Arc::new(Recorder::new(1)), now),
            now,
        }
    }

    /// Every I/O asked for, connects reported done.
    fn io(&mut self) -> Vec<Io> {
        let mut all = Vec::new();
        while let Some(io) = self.ep.poll_io() {
            if let Io::Connect(id) = io {
                self.ep.handle_connected(id);
            }
            all.push(io);
        }
        all
    }

    fn out(&mut self, id: ConnId) -> Vec<String> {
        let out = self.ep.pending(id).to_vec();
        self.ep.handle_sent(id, out.len(), self.now);
        let mut rest = &out[..];
        let mut words = Vec::new();
        while let Ok(resp::Status::Complete((Reply::Array(Some(items)), used))) =
            resp::decode(rest, &Limits::default())
        {
            let all: Vec<String> = items
                .iter()
                .map(|i| match i {
                    Reply::Bulk(Some(w)) => String::from_utf8_lossy(w).into_owned(),
                    _ => String::new(),
                })
                .collect();
            words.push(all.join(" "));
            rest = &rest[used..];
        }
        words
    }

    fn reply(&mut self, id: ConnId, bytes: &[u8]) {
        let buf = self.ep.recv_buf(id, self.now).expect("room");
        buf[..bytes.len()].copy_from_slice(bytes);
        self.ep.handle_recv(id, bytes.len(), self.now);
    }

    /// Answers the master's setup, its `ROLE` saying `role`.
    fn answer_setup(&mut self, role: &str, id: char) {
        let mut r = Vec::new();
        for _ in SCRIPTS {
            r.extend_from_slice(b"$40\r\n0000000000000000000000000000000000000000\r\n");
        }
        r.extend_from_slice(format!("*3\r\n${}\r\n{role}\r\n:0\r\n*0\r\n", role.len()).as_bytes());
        let text = format!(
            "redis_version:7.0.15\r\nrun_id:{}\r\n",
            id.to_string().repeat(40)
        );
        r.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
        r.extend_from_slice(b"*2\r\n$-1\r\n$-1\r\n");
        self.reply(MASTER, &r);
    }

    fn step(&mut self, caller: CallerId, run: u64, m: &mut One) {
        use rand_core::SeedableRng;
        let mut rng = Jitter::from_seed([7; 32]);
        self.ep.step(caller, run, m, self.now, &mut rng);
    }
}

const MASTER: ConnId = ConnId {
    node: 0,
    sub: false,
};
const ASK: ConnId = ConnId {
    node: 1,
    sub: false,
};
const HEAR: ConnId = ConnId { node: 1, sub: true };

fn bulk_array(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    out
}

#[test]
fn a_sentinel_member_uses_only_a_master_its_sentinels_named_and_follows_it() {
    let mut net = Net::new();
    // Nothing goes to the member before a master is named: it fails at once.
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut early = One::new(
        What::Acquire {
            token: Token::from_random([1; 20]),
        },
        None,
    );
    net.step(caller, run, &mut early);
    assert!(
        matches!(&early.failures[..], [NodeErrorKind::Server { message, .. }]
        if message.starts_with("MASTERDOWN")),
        "{:?}",
        early.failures
    );
    net.ep.finish(caller, run, net.now);
    // The first sentinel does not know the service: the second is asked.
    net.ep.connect_all(net.now);
    assert_eq!(net.io(), [Io::Connect(ASK)]);
    assert_eq!(
        net.ep.connect_addr(ASK),
        Target::Tcp("127.0.0.1:26379".parse().unwrap())
    );
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.reply(ASK, b"*-1\r\n");
    assert_eq!(net.io(), [Io::Close(ASK), Io::Connect(ASK)]);
    assert_eq!(
        net.ep.connect_addr(ASK),
        Target::Tcp("127.0.0.1:26380".parse().unwrap())
    );
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.reply(ASK, &bulk_array(&["127.0.0.1", "6400"]));
    // It names a master: `+switch-master` is heard on it, and the master connected.
    assert_eq!(net.io(), [Io::Connect(HEAR), Io::Connect(MASTER)]);
    assert_eq!(net.out(HEAR), ["SUBSCRIBE +switch-master"]);
    assert_eq!(
        net.ep.connect_addr(MASTER),
        Target::Tcp("127.0.0.1:6400".parse().unwrap())
    );
    let setup = net.out(MASTER);
    assert!(setup.contains(&"ROLE".to_string()), "{setup:?}");
    net.answer_setup("master", 'a');
    // A release is written to it, and not answered.
    let run = net.ep.begin(caller);
    let mut release = One::new(
        What::Release {
            token: Token::from_random([2; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    net.step(caller, run, &mut release);
    assert_eq!(net.out(MASTER), ["MINE"]);
    // The sentinels switch to another master: the old connection is given up, and the release
    // goes to the new one, behind its setup, which must say master.
    net.reply(HEAR, &bulk_array(&["subscribe", "+switch-master"]));
    net.reply(
        HEAR,
        &bulk_array(&[
            "message",
            "+switch-master",
            "svc 127.0.0.1 6400 127.0.0.1 6401",
        ]),
    );
    let io = net.io();
    assert!(
        io.contains(&Io::Close(MASTER)) && io.contains(&Io::Connect(MASTER)),
        "{io:?}"
    );
    assert_eq!(
        net.ep.connect_addr(MASTER),
        Target::Tcp("127.0.0.1:6401".parse().unwrap())
    );
    let setup = net.out(MASTER);
    assert!(
        setup.iter().any(|c| c == "ROLE") && !setup.iter().any(|c| c == "MINE"),
        "the release waits behind the setup"
    );
    // The new master turns out to be a replica: nothing behind its setup is sent, the release
    // stays owed, and the sentinels are asked again.
    net.answer_setup("slave", 'b');
    net.step(caller, run, &mut release);
    assert!(release.replies.is_empty(), "{:?}", release.replies);
    assert!(net.ep.needs_tending(net.now), "the release is still owed");
    assert!(net.out(MASTER).is_empty());
    net.io();
    net.now += 60 * MS;
    net.ep.handle_timeout(net.now);
    net.io();
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.reply(ASK, &bulk_array(&["127.0.0.1", "6402"]));
    assert_eq!(net.io().last(), Some(&Io::Connect(MASTER)));
    assert_eq!(
        net.ep.connect_addr(MASTER),
        Target::Tcp("127.0.0.1:6402".parse().unwrap())
    );
    net.out(MASTER);
    net.answer_setup("master", 'c');
    assert_eq!(net.out(MASTER), ["MINE"]);
    net.reply(MASTER, b":1\r\n");
    net.step(caller, run, &mut release);
    assert_eq!(release.replies, ["Integer(1)"]);
    assert!(!net.ep.needs_tending(net.now));
}

/// A release kept for a Sentinel member before its sentinels named a master waits for the
/// sentinels' answer: the endpoint's timer is not due again and again meanwhile (a driver
/// would spin on it, and the simulation never got past that instant).
#[test]
fn a_release_kept_before_a_master_is_named_does_not_keep_the_timer_due() {
    let mut net = Net::new();
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut release = One::new(
        What::Release {
            token: Token::from_random([3; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    net.step(caller, run, &mut release);
    net.ep.connect_all(net.now);
    assert_eq!(net.io(), [Io::Connect(ASK)]);
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.now += MS;
    net.ep.handle_timeout(net.now);
    net.io();
    let due = net.ep.poll_timeout();
    assert!(
        due.is_some_and(|t| t > net.now),
        "the timer is due at {:?}, {:?} before now, while the sentinels are asked",
        due,
        due.map(|t| net.now.saturating_duration_since(t))
    );
}

/// A sentinel that names its master by a host name (`resolve-hostnames yes`): the endpoint
/// makes no system call to resolve it, it asks the shell (`Io::Resolve`), and uses the
/// address the shell hands back; a name the shell cannot resolve moves the question on.
#[test]
fn a_master_named_by_a_host_name_is_resolved_by_the_shell() {
    let mut net = Net::new();
    net.ep.connect_all(net.now);
    assert_eq!(net.io(), [Io::Connect(ASK)]);
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.reply(ASK, &bulk_array(&["master.redlock-mux.invalid", "6400"]));
    let io = net.io();
    assert!(
        !io.contains(&Io::Close(ASK)),
        "the endpoint resolved the name itself and gave the sentinel up: {io:?}"
    );
    let ask = Io::Resolve {
        member: 0,
        switch: false,
    };
    assert_eq!(io, [ask]);
    assert_eq!(
        net.ep.name_to_resolve(0, false),
        Some(("master.redlock-mux.invalid", 6400))
    );
    // The shell resolves it: the member connects to that address.
    let addr = "127.0.0.1:6400".parse().unwrap();
    net.ep.handle_resolved(0, false, Some(addr), net.now);
    assert_eq!(net.io(), [Io::Connect(HEAR), Io::Connect(MASTER)]);
    assert_eq!(net.ep.connect_addr(MASTER), Target::Tcp(addr));
    net.out(MASTER);
    net.answer_setup("master", 'a');
    // A `+switch-master` to a name: resolved by the shell too, and followed.
    net.out(HEAR);
    net.reply(HEAR, &bulk_array(&["subscribe", "+switch-master"]));
    let switch = "svc 127.0.0.1 6400 master2.redlock-mux.invalid 6401";
    net.reply(HEAR, &bulk_array(&["message", "+switch-master", switch]));
    let ask = Io::Resolve {
        member: 0,
        switch: true,
    };
    assert_eq!(net.io(), [ask]);
    let moved = "127.0.0.1:6401".parse().unwrap();
    net.ep.handle_resolved(0, true, Some(moved), net.now);
    let io = net.io();
    assert!(
        io.contains(&Io::Close(MASTER)) && io.contains(&Io::Connect(MASTER)),
        "{io:?}"
    );
    assert_eq!(net.ep.connect_addr(MASTER), Target::Tcp(moved));
    // A name the shell cannot resolve is an answer no sentinel gives: the next one is asked
    // (the round asked the second sentinel, the one after the sentinel that named a replica).
    net.out(MASTER);
    net.answer_setup("slave", 'b');
    net.io();
    net.now += 60 * MS;
    net.ep.handle_timeout(net.now);
    net.io();
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
    net.reply(ASK, &bulk_array(&["gone.redlock-mux.invalid", "6402"]));
    assert_eq!(
        net.io(),
        [Io::Resolve {
            member: 0,
            switch: false
        }]
    );
    net.ep.handle_resolved(0, false, None, net.now);
    assert_eq!(net.io(), [Io::Close(ASK), Io::Connect(ASK)]);
    assert_eq!(
        net.ep.connect_addr(ASK),
        Target::Tcp("127.0.0.1:26379".parse().unwrap())
    );
    assert_eq!(net.out(ASK), ["SENTINEL get-master-addr-by-name svc"]);
}
