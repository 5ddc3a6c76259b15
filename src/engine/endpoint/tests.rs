//! The endpoint on its own, driven by hand: bytes in, bytes out, virtual time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::config::{Config, RwPolicy};
use crate::engine::machine::{Tag, Transmit, What};
use crate::engine::ops::{ScriptForm, SCRIPTS};
use crate::resp::{self, Limits};
use crate::rng::{Jitter, Token};
use crate::url::NodeAddr;

const MS: Duration = Duration::from_millis(1);

fn config(nodes: usize) -> Arc<Config> {
    Arc::new(Config {
        nodes: (0..nodes)
            .map(|i| NodeAddr::parse(&format!("127.0.0.1:{}", 7000 + i)).unwrap())
            .collect(),
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

/// A machine that sends one command to every node and records what comes back. Its bytes
/// say which form it was written in: `NATIVE` where the server has `HSETEX`, else `LUA`.
struct Probe {
    what: What,
    redo: Option<Instant>,
    tag: Option<Tag>,
    sent: bool,
    replies: Vec<(usize, String)>,
    failures: Vec<(usize, NodeErrorKind)>,
    /// Its command is the mutex release script by digest, as a lock sends it.
    evalsha: bool,
}

impl Probe {
    fn new(what: What, redo: Option<Instant>) -> Probe {
        Probe {
            what,
            redo,
            tag: Some(1),
            sent: false,
            replies: Vec::new(),
            failures: Vec::new(),
            evalsha: false,
        }
    }
}

impl Machine for Probe {
    type Output = ();

    fn handle_reply(
        &mut self,
        node: usize,
        _tag: Tag,
        reply: &Reply<'_>,
        _now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        let text = match reply {
            Reply::Error(m) => format!("Error({})", String::from_utf8_lossy(m)),
            other => format!("{other:?}"),
        };
        self.replies.push((node, text));
    }

    fn handle_failure(
        &mut self,
        node: usize,
        _tag: Tag,
        why: NodeErrorKind,
        _now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        self.failures.push((node, why));
    }

    fn handle_timeout(&mut self, _now: Instant, _rng: &mut dyn Entropy) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Transmit {
            to: To::All,
            tag: self.tag,
            form: ScriptForm::Sha,
            what: self.what,
            redo: self.redo,
        })
    }

    fn encode(&self, t: &Transmit, caps: Caps, out: &mut Vec<u8>) -> usize {
        if self.evalsha {
            use crate::engine::ops::{write_eval, Arg, RELEASE};
            write_eval(out, &RELEASE, t.form, &[b"k"], &[Arg::Bytes(b"t")]);
            return 0;
        }
        let name: &[u8] = if caps.hsetex { b"NATIVE" } else { b"LUA" };
        resp::encode_command(out, &[name]);
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<()> {
        None
    }
}

fn rng() -> Jitter {
    use rand_core::SeedableRng;
    Jitter::from_seed([7; 32])
}

/// The I/O shell's side, by hand.
struct Net {
    ep: Endpoint,
    now: Instant,
}

const INFO_82: &str = "redis_version:8.2.3\r\nrun_id:";

impl Net {
    fn new(nodes: usize) -> Net {
        let now = Instant::now();
        Net {
            ep: Endpoint::new(config(nodes), Arc::new(Recorder::new(nodes)), now),
            now,
        }
    }

    /// One node whose command connection is up and set up as a server with `info` and
    /// `hsetex` (run id of 'a's).
    fn ready(info: &str, hsetex: bool) -> Net {
        let mut net = Net::new(1);
        net.ep.connect_all(net.now);
        net.connect_all();
        net.take_output(Self::cmd(0));
        net.answer_setup(0, info, 'a', hsetex);
        net
    }

    fn cmd(node: usize) -> ConnId {
        ConnId { node, sub: false }
    }

    /// Takes every `Io::Connect` and reports the connects done.
    fn connect_all(&mut self) -> Vec<ConnId> {
        let mut done = Vec::new();
        while let Some(io) = self.ep.poll_io() {
            if let Io::Connect(id) = io {
                self.ep.handle_connected(id);
                done.push(id);
            }
        }
        done
    }

    /// Everything `id` has to write, as written.
    fn take_output(&mut self, id: ConnId) -> Vec<u8> {
        let out = self.ep.pending(id).to_vec();
        self.ep.handle_sent(id, out.len(), self.now);
        out
    }

    fn reply(&mut self, id: ConnId, bytes: &[u8]) {
        let buf = self.ep.recv_buf(id, self.now).expect("room");
        buf[..bytes.len()].copy_from_slice(bytes);
        self.ep.handle_recv(id, bytes.len(), self.now);
    }

    /// Answers a command connection's setup as a server with `info` (its `INFO server` text,
    /// followed by a run id made of `id`) and `hsetex`.
    fn answer_setup(&mut self, node: usize, info: &str, id: char, hsetex: bool) {
        let mut r = Vec::new();
        for _ in SCRIPTS {
            r.extend_from_slice(b"$40\r\n0000000000000000000000000000000000000000\r\n");
        }
        let text = format!("{info}{}\r\n", id.to_string().repeat(40));
        r.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
        if hsetex {
            r.extend_from_slice(b"*2\r\n$-1\r\n*1\r\n$6\r\nhsetex\r\n");
        } else {
            r.extend_from_slice(b"*2\r\n$-1\r\n$-1\r\n");
        }
        self.reply(Self::cmd(node), &r);
    }

    fn step(&mut self, caller: CallerId, run: u64, m: &mut Probe) {
        let mut rng = rng();
        self.ep.step(caller, run, m, self.now, &mut rng);
    }
}

/// The commands in `bytes`, by their first word.
fn words(bytes: &[u8]) -> Vec<String> {
    let mut rest = bytes;
    let mut out = Vec::new();
    while let Ok(resp::Status::Complete((Reply::Array(Some(items)), used))) =
        resp::decode(rest, &Limits::default())
    {
        if let Some(Reply::Bulk(Some(w))) = items.first() {
            out.push(String::from_utf8_lossy(w).into_owned());
        }
        rest = &rest[used..];
    }
    out
}

#[test]
fn a_reconnect_never_changes_the_form_of_a_command() {
    let mut net = Net::new(1);
    net.ep.connect_all(net.now);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', true);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["NATIVE"]);
    net.ep.finish(caller, run, net.now);

    // The connection breaks; the next command goes behind a new setup, not answered yet: it
    // is written for the server the node was, not for "nothing known".
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    net.now += 20 * MS;
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', true);
    let sent = words(&net.take_output(Net::cmd(0)));
    assert_eq!(sent, ["NATIVE"]);
    assert!(m.failures.is_empty(), "{:?}", m.failures);
}

#[test]
fn commands_written_for_a_server_that_changed_are_not_sent() {
    let mut net = Net::new(1);
    net.ep.connect_all(net.now);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', true);
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    net.now += 20 * MS;
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    net.connect_all();
    let setup = words(&net.take_output(Net::cmd(0)));
    assert!(!setup.contains(&"NATIVE".to_string()), "{setup:?}");
    // Downgraded to 7.0 on its data: the held NATIVE command fails, unsent.
    net.answer_setup(0, "redis_version:7.0.15\r\nrun_id:", 'a', false);
    assert!(net.ep.poll_io() == Some(Io::Close(Net::cmd(0))));
    assert!(!net.ep.wants_write(Net::cmd(0)));
    let mut rng = rng();
    net.ep.step(caller, run, &mut m, net.now, &mut rng);
    assert!(
        matches!(m.failures.as_slice(), [(0, NodeErrorKind::ServerChanged)]),
        "{:?}",
        m.failures
    );
    // What comes next is written for the server it is now.
    net.ep.finish(caller, run, net.now);
    net.now += 50 * MS;
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, "redis_version:7.0.15\r\nrun_id:", 'a', false);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
}

#[test]
fn a_release_whose_connection_broke_is_sent_again_first_on_the_next() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([1; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    // Written, not answered: the connection breaks. The release is not failed to its owner,
    // who still waits for it: it goes again.
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    net.step(caller, run, &mut release);
    assert!(release.failures.is_empty(), "{:?}", release.failures);
    // Once the backoff has passed, the endpoint reconnects for it by itself.
    let due = net.ep.poll_timeout().expect("a reconnect is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    let setup = net.take_output(Net::cmd(0));
    assert!(!words(&setup).contains(&"LUA".to_string()));
    net.answer_setup(0, INFO_82, 'a', false);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.reply(Net::cmd(0), b":1\r\n");
    net.step(caller, run, &mut release);
    assert_eq!(release.replies, [(0, "Integer(1)".to_string())]);
    assert!(!net.ep.busy(net.now));
}

#[test]
fn an_acquisition_written_before_a_break_is_failed_and_never_sent_again() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([2; 20]);
    let mut acquire = Probe::new(What::Acquire { token }, None);
    net.step(caller, run, &mut acquire);
    net.take_output(Net::cmd(0));
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    net.step(caller, run, &mut acquire);
    assert_eq!(acquire.failures.len(), 1);
    assert_eq!(net.ep.poll_timeout(), None);
    assert!(!net.ep.busy(net.now));
}

#[test]
fn a_transaction_aborted_for_a_refused_command_reports_the_refusal() {
    struct Multi(Probe);
    impl Machine for Multi {
        type Output = ();
        fn handle_reply(
            &mut self,
            n: usize,
            t: Tag,
            r: &Reply<'_>,
            now: Instant,
            g: &mut dyn Entropy,
        ) {
            self.0.handle_reply(n, t, r, now, g)
        }
        fn handle_failure(
            &mut self,
            n: usize,
            t: Tag,
            w: NodeErrorKind,
            now: Instant,
            g: &mut dyn Entropy,
        ) {
            self.0.handle_failure(n, t, w, now, g)
        }
        fn handle_timeout(&mut self, _: Instant, _: &mut dyn Entropy) {}
        fn poll_transmit(&mut self) -> Option<Transmit> {
            self.0.poll_transmit()
        }
        fn encode(&self, _: &Transmit, _: Caps, out: &mut Vec<u8>) -> usize {
            for w in [&b"MULTI"[..], b"HDEL", b"EXEC"] {
                resp::encode_command(out, &[w]);
            }
            2
        }
        fn poll_timeout(&self) -> Option<Instant> {
            None
        }
        fn poll_outcome(&mut self) -> Option<()> {
            None
        }
    }
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut m = Multi(Probe::new(What::Subscribe, None));
    let mut rng = rng();
    net.ep.step(caller, run, &mut m, net.now, &mut rng);
    net.take_output(Net::cmd(0));
    net.reply(
        Net::cmd(0),
        b"+OK\r\n-READONLY You can't write against a read only replica.\r\n\
          -EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    net.ep.step(caller, run, &mut m, net.now, &mut rng);
    assert_eq!(m.0.replies.len(), 1);
    assert!(m.0.replies[0].1.contains("READONLY"), "{:?}", m.0.replies);
}

#[test]
fn one_server_reached_as_two_nodes_is_a_configuration_error() {
    let mut net = Net::new(2);
    net.ep.connect_all(net.now);
    net.connect_all();
    for i in 0..2 {
        net.take_output(Net::cmd(i));
    }
    net.answer_setup(0, INFO_82, 'a', false);
    net.answer_setup(1, INFO_82, 'a', false);
    let failures = net.ep.setup_failures();
    assert!(
        matches!(failures.as_slice(), [(1, NodeErrorKind::Setup { cause, .. })]
            if matches!(**cause, NodeErrorKind::SameServer { node: 0 })),
        "{failures:?}"
    );
}

#[test]
fn acquisitions_skip_a_node_that_is_behind_and_releases_do_not() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut first = Probe::new(
        What::Acquire {
            token: Token::from_random([3; 20]),
        },
        None,
    );
    net.step(caller, run, &mut first);
    net.take_output(Net::cmd(0));
    // No reply for longer than the node timeout: the node is behind.
    net.now += 60 * MS;
    let mut late = Bits::default();
    net.ep.late_nodes(net.now, &mut late);
    assert_eq!((late.pop_first(), late.pop_first()), (Some(0), None));
    let mut second = Probe::new(
        What::Acquire {
            token: Token::from_random([4; 20]),
        },
        None,
    );
    net.step(caller, run, &mut second);
    assert!(matches!(
        second.failures.as_slice(),
        [(0, NodeErrorKind::Timeout)]
    ));
    assert!(!net.ep.wants_write(Net::cmd(0)));
    let mut release = Probe::new(
        What::Release {
            token: Token::from_random([3; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    net.step(caller, run, &mut release);
    assert!(release.failures.is_empty());
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    // The connection is never given up for slowness.
    net.now += 10_000 * MS;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.ep.poll_io(), None);
    assert!(net.ep.is_open(Net::cmd(0)));
}

#[test]
fn a_release_waiting_for_a_node_that_stays_down_is_failed_to_its_owner_at_its_node_timeout() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([3; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    let written = net.now;
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    // The node stays down: every reconnect is refused. Its owner must hear by the node
    // timeout of what it sent, not wait for as long as the release is kept to send again.
    let refused = NodeErrorKind::Connect(std::io::ErrorKind::ConnectionRefused);
    for _ in 0..1000 {
        net.step(caller, run, &mut release);
        if !release.failures.is_empty() {
            break;
        }
        let due = net
            .ep
            .poll_timeout()
            .expect("the endpoint has something due");
        assert!(
            due <= written + 50 * MS,
            "nothing is due for the waiting owner: next at {:?}",
            due - written
        );
        net.now = net.now.max(due);
        net.ep.handle_timeout(net.now);
        while let Some(io) = net.ep.poll_io() {
            if let Io::Connect(id) = io {
                net.ep.handle_connect_failed(id, refused.clone(), net.now);
            }
        }
    }
    assert!(
        matches!(release.failures.as_slice(), [(0, NodeErrorKind::Timeout)]),
        "{:?} at {:?}",
        release.failures,
        net.now - written
    );
    assert!(net.now - written <= 50 * MS, "{:?}", net.now - written);
    // The release is still owed to the node, for when it comes back.
    assert!(net.ep.needs_tending(net.now));
}

#[test]
fn a_node_that_refuses_every_setup_is_reconnected_ever_more_slowly() {
    let mut net = Net::new(1);
    let caller = net.ep.open_caller();
    let mut refused_at = Vec::new();
    for _ in 0..4 {
        // A command for the node: it connects if it may, and its setup is refused (a password
        // the server does not take).
        let run = net.ep.begin(caller);
        let mut m = Probe::new(What::Subscribe, None);
        net.step(caller, run, &mut m);
        if net.connect_all().is_empty() {
            // Still backing off: the command failed at once, with the setup's refusal.
            assert!(
                matches!(m.failures.as_slice(), [(0, NodeErrorKind::Setup { .. })]),
                "{:?}",
                m.failures
            );
            net.ep.finish(caller, run, net.now);
            net.now += MS;
            continue;
        }
        net.take_output(Net::cmd(0));
        net.reply(
            Net::cmd(0),
            b"-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n",
        );
        assert_eq!(net.ep.poll_io(), Some(Io::Close(Net::cmd(0))));
        refused_at.push(net.now);
        net.ep.finish(caller, run, net.now);
        net.now += MS;
    }
    // 4 ms of tries: the first refusal, then a wait of at least the least backoff.
    assert_eq!(refused_at.len(), 1, "{refused_at:?}");
    let mut gaps = Vec::new();
    let mut last = refused_at[0];
    while gaps.len() < 3 {
        net.now += MS;
        let run = net.ep.begin(caller);
        let mut m = Probe::new(What::Subscribe, None);
        net.step(caller, run, &mut m);
        if !net.connect_all().is_empty() {
            net.take_output(Net::cmd(0));
            net.reply(Net::cmd(0), b"-NOAUTH Authentication required.\r\n");
            assert_eq!(net.ep.poll_io(), Some(Io::Close(Net::cmd(0))));
            gaps.push(net.now - last);
            last = net.now;
        }
        net.ep.finish(caller, run, net.now);
    }
    // A connect that succeeds but whose setup is refused is no success: the backoff grows, as
    // for a connect refused outright, rather than hammering the server every 10 ms.
    assert!(
        gaps[1] > gaps[0] && gaps[2] > gaps[1],
        "reconnects to a node that refuses every setup came {gaps:?} apart"
    );
}

#[test]
fn the_cleanup_of_an_attempt_kept_off_a_node_is_not_sent_there() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut first = Probe::new(
        What::Acquire {
            token: Token::from_random([5; 20]),
        },
        None,
    );
    net.step(caller, run, &mut first);
    net.take_output(Net::cmd(0));
    // The node is behind: the next attempt is kept off it, and counts as timed out.
    net.now += 60 * MS;
    let token = Token::from_random([6; 20]);
    let mut attempt = Probe::new(What::Acquire { token }, None);
    net.step(caller, run, &mut attempt);
    assert!(matches!(
        attempt.failures.as_slice(),
        [(0, NodeErrorKind::Timeout)]
    ));
    // Its cleanup has nothing to delete there: sending it would only deepen the backlog of a
    // node too slow for the load (every lost attempt of every caller sends one).
    let mut cleanup = Probe::new(What::Cleanup { token }, Some(net.now + 10_000 * MS));
    cleanup.tag = None;
    net.step(caller, run, &mut cleanup);
    assert!(!net.ep.wants_write(Net::cmd(0)), "the cleanup was queued");
    // The cleanup of an attempt that went out still goes.
    let mut cleanup = Probe::new(
        What::Cleanup {
            token: Token::from_random([5; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    cleanup.tag = None;
    net.step(caller, run, &mut cleanup);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
}

#[test]
fn a_release_kept_to_send_again_that_expires_before_the_reconnect_is_failed_to_its_owner() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([3; 20]);
    // What the release deletes expires 20 ms from now (a short TTL, released late): well
    // before the node timeout of 50 ms.
    let mut release = Probe::new(What::Release { token }, Some(net.now + 20 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    // Past the release's expiry and the backoff, before its node timeout, another caller's
    // command makes the endpoint reconnect: the release is not sent again (nothing of it is
    // left to delete), and its owner must hear of it now, not wait for ever.
    net.now += 30 * MS;
    let other = net.ep.open_caller();
    let other_run = net.ep.begin(other);
    let mut acquire = Probe::new(
        What::Acquire {
            token: Token::from_random([4; 20]),
        },
        None,
    );
    net.step(other, other_run, &mut acquire);
    assert_eq!(net.ep.poll_io(), Some(Io::Connect(Net::cmd(0))));
    for _ in 0..100 {
        net.step(caller, run, &mut release);
        if !release.failures.is_empty() {
            break;
        }
        let Some(due) = net.ep.poll_timeout() else {
            break;
        };
        net.now = net.now.max(due);
        net.ep.handle_timeout(net.now);
    }
    assert!(
        matches!(release.failures.as_slice(), [(0, _)]),
        "the release's owner heard nothing: {:?}, {:?}",
        release.failures,
        release.replies
    );
}

/// Runs the endpoint's timers until it writes something (the owner's node timeout may come
/// first, and sends nothing).
fn resend(net: &mut Net) {
    for _ in 0..4 {
        let due = net.ep.poll_timeout().expect("something is due");
        net.now = net.now.max(due);
        net.ep.handle_timeout(net.now);
        if net.ep.wants_write(Net::cmd(0)) {
            return;
        }
    }
    panic!("nothing sent again");
}

#[test]
fn a_release_refused_busy_stays_owed_and_goes_again_after_a_backoff() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([5; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    let busy = b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or \
                 SHUTDOWN NOSAVE.\r\n";
    net.reply(Net::cmd(0), busy);
    net.step(caller, run, &mut release);
    // Not run, and not given up: its owner still waits (until its node timeout).
    assert!(release.replies.is_empty(), "{:?}", release.replies);
    assert!(release.failures.is_empty(), "{:?}", release.failures);
    assert!(net.ep.busy(net.now) && net.ep.needs_tending(net.now));
    assert_eq!(net.ep.undelivered(net.now), [0]);
    // Its owner returns (the round was won elsewhere): the release is still owed, and goes
    // again after a backoff that doubles while the node refuses it.
    net.ep.finish(caller, run, net.now);
    let mut gaps = Vec::new();
    let mut last = net.now;
    for refusal in 0..4 {
        resend(&mut net);
        assert_eq!(
            words(&net.take_output(Net::cmd(0))),
            ["LUA"],
            "try {refusal}"
        );
        gaps.push(net.now - last);
        last = net.now;
        net.reply(Net::cmd(0), busy);
        assert!(net.ep.needs_tending(net.now));
    }
    // Sent again at the backoff, never before it.
    assert_eq!(gaps, [10 * MS, 20 * MS, 40 * MS, 80 * MS]);
    // `TRYAGAIN` and `LOADING` are refusals for a while too; an answer ends it.
    for refusal in [
        &b"-LOADING Redis is loading the dataset in memory\r\n"[..],
        b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
    ] {
        resend(&mut net);
        assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
        net.reply(Net::cmd(0), refusal);
    }
    resend(&mut net);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.reply(Net::cmd(0), b":1\r\n");
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    assert!(net.ep.undelivered(net.now).is_empty());
    assert_eq!(net.ep.poll_timeout(), None);
}

#[test]
fn a_release_refused_until_what_it_deletes_expired_is_given_up() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([6; 20]);
    let until = net.now + 100 * MS;
    let mut release = Probe::new(What::Release { token }, Some(until));
    net.step(caller, run, &mut release);
    net.take_output(Net::cmd(0));
    let busy = b"-BUSY Redis is busy running a script.\r\n";
    net.reply(Net::cmd(0), busy);
    let mut tries = 1;
    while let Some(due) = net.ep.poll_timeout() {
        assert!(
            tries < 20 && due <= until + 50 * MS,
            "{tries} tries, next at {due:?}"
        );
        net.now = due;
        net.ep.handle_timeout(net.now);
        net.step(caller, run, &mut release);
        if net.ep.wants_write(Net::cmd(0)) {
            net.take_output(Net::cmd(0));
            net.reply(Net::cmd(0), busy);
            tries += 1;
        }
    }
    assert!(
        net.now >= until - 50 * MS,
        "given up early, at {:?}",
        until - net.now
    );
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    assert!(net.ep.undelivered(net.now).is_empty());
    // Its owner heard that the node did not run it by its node timeout.
    assert!(
        matches!(
            release.failures.as_slice(),
            [(0, NodeErrorKind::Timeout), ..]
        ),
        "{:?}",
        release.failures
    );
}

#[test]
fn a_release_answered_noscript_goes_again_at_once_with_the_script_body() {
    use crate::engine::ops::RELEASE;
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([7; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    release.evalsha = true;
    net.step(caller, run, &mut release);
    let sent = net.take_output(Net::cmd(0));
    assert_eq!(words(&sent), ["EVALSHA"]);
    // The caller returned already (the round was won elsewhere).
    net.ep.finish(caller, run, net.now);
    net.reply(
        Net::cmd(0),
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    );
    let again = net.take_output(Net::cmd(0));
    assert_eq!(words(&again), ["EVAL"]);
    let mut expected = Vec::new();
    crate::engine::ops::write_eval(
        &mut expected,
        &RELEASE,
        ScriptForm::Body,
        &[b"k"],
        &[crate::engine::ops::Arg::Bytes(b"t")],
    );
    assert_eq!(again, expected);
    assert!(net.ep.busy(net.now) && net.ep.needs_tending(net.now));
    net.reply(Net::cmd(0), b":1\r\n");
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    assert!(net.ep.undelivered(net.now).is_empty());
}

/// A node too slow for its load runs the lock's write late, then answers the release after
/// it `NOSCRIPT` (its script cache flushed meanwhile) once the lock's TTL since the release
/// was sent has passed: the entry was written just before, so it lives on for up to a TTL
/// from that answer, and the release still goes again with its body (SlowFlush, seed 384).
#[test]
fn a_release_answered_noscript_after_its_ttl_from_a_slow_node_still_goes_again() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([7; 20]);
    // The lock's TTL is 50 ms: worth sending again until 50 ms after it was sent.
    let mut release = Probe::new(What::Release { token }, Some(net.now + 50 * MS));
    release.evalsha = true;
    net.step(caller, run, &mut release);
    let sent = net.take_output(Net::cmd(0));
    assert_eq!(words(&sent), ["EVALSHA"]);
    net.ep.finish(caller, run, net.now);
    // The node's backlog: its answer comes 80 ms later, after a write it ran just before.
    net.now += 80 * MS;
    net.reply(
        Net::cmd(0),
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    );
    let again = net.take_output(Net::cmd(0));
    assert_eq!(
        words(&again),
        ["EVAL"],
        "a release refused NOSCRIPT after its first TTL was not sent again"
    );
    assert!(net.ep.busy(net.now) && net.ep.needs_tending(net.now));
    assert_eq!(net.ep.undelivered(net.now), [0]);
    net.reply(Net::cmd(0), b":1\r\n");
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    assert!(net.ep.undelivered(net.now).is_empty());
}

#[test]
fn only_our_scripts_by_digest_are_rewritten_with_their_bodies() {
    use crate::engine::ops::{write_eval, Arg, ScriptForm, RELEASE, SCRIPTS};
    let mut commands = Vec::new();
    resp::encode_command(&mut commands, &[b"MULTI"]);
    write_eval(
        &mut commands,
        &RELEASE,
        ScriptForm::Sha,
        &[b"k"],
        &[Arg::Num(7)],
    );
    let sharded = RELEASE.announcing(true);
    write_eval(&mut commands, sharded, ScriptForm::Sha, &[b"{k}"], &[]);
    resp::encode_command(&mut commands, &[b"EVALSHA", &[b'0'; 40], b"0"]);
    resp::encode_command(&mut commands, &[b"EXEC"]);
    let mut expected = Vec::new();
    resp::encode_command(&mut expected, &[b"MULTI"]);
    write_eval(
        &mut expected,
        &RELEASE,
        ScriptForm::Body,
        &[b"k"],
        &[Arg::Num(7)],
    );
    write_eval(&mut expected, sharded, ScriptForm::Body, &[b"{k}"], &[]);
    resp::encode_command(&mut expected, &[b"EVALSHA", &[b'0'; 40], b"0"]);
    resp::encode_command(&mut expected, &[b"EXEC"]);
    assert_eq!(conn::with_bodies(&commands), Some(expected));
    let mut none = Vec::new();
    resp::encode_command(&mut none, &[b"EVALSHA", &[b'0'; 40], b"0"]);
    assert_eq!(conn::with_bodies(&none), None);
    assert_eq!(conn::with_bodies(b"*2\r\n$7\r\nEVALSHA"), None);
    for s in SCRIPTS {
        assert!(std::ptr::eq(
            crate::engine::scripts::by_sha(&s.sha).unwrap(),
            *s
        ));
    }
}

/// What a `WAITAOF` reply says of the grant before it: it counts only when both counts reach
/// the URL's `L,R`; a short count, an error or another shape is a failure, never a vote.
#[test]
fn waitaof_counts_only_enough_fsyncs() {
    let limits = Limits::default();
    let wants = (0, Some((1, 1)));
    let check = |bytes: &[u8]| waited(bytes, wants, Slot::WaitAof, &limits);
    assert_eq!(check(b"*2\r\n:1\r\n:1\r\n"), Ok(()));
    assert_eq!(check(b"*2\r\n:1\r\n:2\r\n"), Ok(()));
    for bad in [
        &b"*2\r\n:1\r\n:0\r\n"[..],
        b"*2\r\n:0\r\n:1\r\n",
        b"-ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled.\r\n",
        b"-ERR unknown command 'WAITAOF'\r\n",
        b":1\r\n",
        b"*1\r\n:1\r\n",
        b"*2\r\n$1\r\n1\r\n:1\r\n",
    ] {
        match check(bad) {
            Err(NodeErrorKind::Server { message, .. }) => assert!(
                message.contains("WAITAOF 1 1"),
                "{}: {message}",
                String::from_utf8_lossy(bad)
            ),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(bad)),
        }
    }
    // `WAIT` before it reads its own count.
    assert_eq!(
        waited(b":1\r\n", (1, Some((1, 1))), Slot::Wait, &limits),
        Ok(())
    );
    assert!(waited(b":0\r\n", (1, Some((1, 1))), Slot::Wait, &limits).is_err());
}

/// On a member with `?wait=1`, a release counts only once `WAIT 1` says a replica has it: one
/// that falls short fails for its owner (never a vote) and stays owed, not sent again on the
/// same connection (only `WAIT`s go there for it), but first thing, with its `WAIT`, on the
/// next one (in a failover, to the
/// promoted replica, which may not have it). So does one whose connection breaks before its
/// `WAIT` answers.
#[test]
fn a_release_the_replicas_did_not_acknowledge_stays_owed_for_the_next_connection() {
    let mut config = Arc::try_unwrap(config(1)).expect("one owner");
    config.nodes[0] = NodeAddr::parse("redis://127.0.0.1:7000?wait=1").unwrap();
    let now = Instant::now();
    let mut net = Net {
        ep: Endpoint::new(Arc::new(config), Arc::new(Recorder::new(1)), now),
        now,
    };
    net.ep.connect_all(net.now);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let token = Token::from_random([9; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
    // The master ran it; no replica acknowledged it in time.
    net.reply(Net::cmd(0), b":1\r\n:0\r\n");
    net.step(caller, run, &mut release);
    assert!(release.replies.is_empty(), "{:?}", release.replies);
    assert_eq!(release.failures.len(), 1, "{:?}", release.failures);
    assert!(format!("{:?}", release.failures[0].1).contains("NOREPLICAS"));
    assert_eq!(net.ep.undelivered(net.now), [0]);
    assert!(net.ep.busy(net.now) && net.ep.needs_tending(net.now));
    net.ep.finish(caller, run, net.now);
    // Not sent again on this connection (the master has it): a `WAIT` of the endpoint's own
    // asks whether the replicas have it now, and falls short too.
    net.now += 100 * MS;
    net.ep.handle_timeout(net.now);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["WAIT"]);
    net.reply(Net::cmd(0), b":0\r\n");
    assert_eq!(net.ep.undelivered(net.now), [0]);
    // The connection breaks: it goes again on the next one, with its `WAIT`.
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let due = net.ep.poll_timeout().expect("a reconnect is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
    // Run, and the `WAIT` not answered yet when this connection breaks too: still owed.
    net.reply(Net::cmd(0), b":0\r\n");
    assert_eq!(net.ep.undelivered(net.now), [0]);
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    assert_eq!(net.ep.undelivered(net.now), [0]);
    let due = net.ep.poll_timeout().expect("a reconnect is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
    // A replica has it: delivered.
    net.reply(Net::cmd(0), b":0\r\n:1\r\n");
    assert!(net.ep.undelivered(net.now).is_empty());
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
}

#[cfg(feature = "tls")]
#[test]
fn a_tls_handshake_unanswered_at_the_connect_timeout_is_a_configuration_error() {
    // One `rediss://` node and one plaintext node, both connected at the TCP level and silent.
    let mut config = Arc::into_inner(config(2)).expect("one owner");
    config.nodes[0] = NodeAddr::parse("rediss://127.0.0.1:7000").unwrap();
    let mut net = Net::new(2);
    net.ep = Endpoint::new(Arc::new(config), Arc::new(Recorder::new(2)), net.now);
    net.ep.connect_all(net.now);
    let mut connecting = Vec::new();
    while let Some(io) = net.ep.poll_io() {
        if let Io::Connect(id) = io {
            connecting.push(id);
        }
    }
    assert_eq!(connecting, [Net::cmd(0), Net::cmd(1)]);
    // The shell reports both streams linked: the TLS one waits for its handshake.
    for &id in &connecting {
        net.ep.handle_linked(id);
    }
    net.now += 100 * MS;
    assert!(net.ep.poll_timeout().is_some_and(|t| t <= net.now));
    net.ep.handle_timeout(net.now);
    let failures = net.ep.setup_failures();
    assert!(
        matches!(
            failures.as_slice(),
            [(0, NodeErrorKind::Setup { command: "TLS", cause })]
                if matches!(**cause, NodeErrorKind::Tls(TlsFailure::NotTls))
        ),
        "{failures:?}"
    );
}

#[test]
fn a_close_before_any_answer_is_probed_and_a_tls_port_is_a_configuration_error() {
    let mut net = Net::new(1);
    net.ep.connect_all(net.now);
    net.connect_all();
    net.take_output(Net::cmd(0));
    // The server closes the connection at the first plaintext bytes, as a TLS port does.
    let reset = NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset);
    net.ep.handle_failed(Net::cmd(0), reset, net.now);
    let probe = Io::Probe {
        id: Net::cmd(0),
        timeout: 100 * MS,
    };
    assert_eq!(net.ep.poll_io(), Some(probe));
    // The connection's failure waits for the probe's answer.
    assert!(net.ep.setup_failures().is_empty());
    net.ep
        .handle_probed(Net::cmd(0), Probed::AnswersTls, net.now);
    let failures = net.ep.setup_failures();
    assert!(
        matches!(
            failures.as_slice(),
            [(0, NodeErrorKind::Setup { command: "TLS", cause })]
                if matches!(**cause, NodeErrorKind::Tls(TlsFailure::TlsPort))
        ),
        "{failures:?}"
    );
}

#[test]
fn a_node_that_answered_before_is_not_probed() {
    let mut net = Net::ready(INFO_82, true);
    let reset = NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset);
    net.ep.handle_failed(Net::cmd(0), reset, net.now);
    let mut io = Vec::new();
    while let Some(x) = net.ep.poll_io() {
        io.push(x);
    }
    assert!(!io.iter().any(|x| matches!(x, Io::Probe { .. })), "{io:?}");
    assert!(net.ep.setup_failures().is_empty());
}

/// A net on one member with `?wait=1`, set up, with a caller and its run.
fn waiting_net() -> (Net, CallerId, u64) {
    let mut config = Arc::try_unwrap(config(1)).expect("one owner");
    config.nodes[0] = NodeAddr::parse("redis://127.0.0.1:7000?wait=1").unwrap();
    let now = Instant::now();
    let mut net = Net {
        ep: Endpoint::new(Arc::new(config), Arc::new(Recorder::new(1)), now),
        now,
    };
    net.ep.connect_all(net.now);
    net.connect_all();
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    (net, caller, run)
}

#[test]
fn a_cleanup_no_wait_confirmed_stays_owed_for_the_next_connection() {
    let (mut net, caller, run) = waiting_net();
    let mut cleanup = Probe::new(
        What::Cleanup {
            token: Token::from_random([8; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    cleanup.tag = None;
    net.step(caller, run, &mut cleanup);
    // Its first try has no `WAIT` of its own (it would hold up the connection).
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    // The master ran it; nothing says a replica has it: a failover now would lose it.
    net.reply(Net::cmd(0), b":1\r\n");
    assert_eq!(
        net.ep.undelivered(net.now),
        [0],
        "a cleanup only the master acknowledged counts as delivered"
    );
    assert!(net.ep.busy(net.now) && net.ep.needs_tending(net.now));
    // The connection breaks (the master died): it goes again on the next one, with its `WAIT`.
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let due = net.ep.poll_timeout().expect("a reconnect is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
    net.reply(Net::cmd(0), b":0\r\n:1\r\n");
    assert!(net.ep.undelivered(net.now).is_empty());
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
}

#[test]
fn a_cleanup_is_confirmed_by_the_next_wait_on_its_connection() {
    let (mut net, caller, run) = waiting_net();
    let mut cleanup = Probe::new(
        What::Cleanup {
            token: Token::from_random([8; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    cleanup.tag = None;
    net.step(caller, run, &mut cleanup);
    let mut acquire = Probe::new(
        What::Acquire {
            token: Token::from_random([7; 20]),
        },
        None,
    );
    net.step(caller, run, &mut acquire);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "LUA", "WAIT"]);
    net.reply(Net::cmd(0), b":1\r\n:1\r\n");
    assert_eq!(net.ep.undelivered(net.now), [0], "before the grant's WAIT");
    // The grant's `WAIT` falls short: the cleanup is not confirmed either.
    net.reply(Net::cmd(0), b":0\r\n");
    assert_eq!(
        net.ep.undelivered(net.now),
        [0],
        "after a WAIT that fell short"
    );
    net.step(caller, run, &mut acquire);
    assert_eq!(acquire.failures.len(), 1, "{:?}", acquire.failures);
    // The next one says a replica has every earlier write of the connection: the cleanup too.
    let mut again = Probe::new(
        What::Acquire {
            token: Token::from_random([6; 20]),
        },
        None,
    );
    net.step(caller, run, &mut again);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
    net.reply(Net::cmd(0), b":1\r\n:1\r\n");
    assert!(net.ep.undelivered(net.now).is_empty());
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
}

/// A lost attempt's cleanup answered on a connection left idle: the endpoint sends a `WAIT` of
/// its own for it, bounded by a quarter of the node timeout (a grant queued behind it still
/// answers within its own), and the cleanup counts once that says a replica has it. One that
/// falls short leaves it owed, and the next follows after a backoff, not at once.
#[test]
fn an_idle_connection_confirms_its_cleanups_with_a_wait_of_its_own() {
    let (mut net, caller, run) = waiting_net();
    let mut cleanup = Probe::new(
        What::Cleanup {
            token: Token::from_random([8; 20]),
        },
        Some(net.now + 10_000 * MS),
    );
    cleanup.tag = None;
    net.step(caller, run, &mut cleanup);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.reply(Net::cmd(0), b":1\r\n");
    let wait = net.take_output(Net::cmd(0));
    assert_eq!(
        String::from_utf8_lossy(&wait),
        "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$2\r\n12\r\n",
        "the idle connection's own WAIT (node timeout 50 ms)"
    );
    net.reply(Net::cmd(0), b":0\r\n");
    assert_eq!(
        net.ep.undelivered(net.now),
        [0],
        "after a WAIT that fell short"
    );
    assert!(
        net.ep.pending(Net::cmd(0)).is_empty(),
        "a WAIT again at once"
    );
    let due = net.ep.poll_timeout().expect("the next WAIT is due");
    assert!(due > net.now);
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["WAIT"]);
    net.reply(Net::cmd(0), b":1\r\n");
    assert!(net.ep.undelivered(net.now).is_empty());
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
}

/// Cleanups owed by a broken connection go again on the next one behind one `WAIT`, not one
/// each: while a promoted master's replicas attach, every `WAIT` runs to its timeout, and one
/// behind each cleanup would hold up the new connection (and every grant queued behind them)
/// for as many node timeouts.
#[test]
fn cleanups_owed_by_a_broken_connection_go_again_behind_one_wait() {
    let (mut net, caller, run) = waiting_net();
    for k in 0..3u8 {
        let mut cleanup = Probe::new(
            What::Cleanup {
                token: Token::from_random([10 + k; 20]),
            },
            Some(net.now + 10_000 * MS),
        );
        cleanup.tag = None;
        net.step(caller, run, &mut cleanup);
    }
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "LUA", "LUA"]);
    net.reply(Net::cmd(0), b":1\r\n:1\r\n:1\r\n");
    // The master ran them; the connection breaks before a `WAIT` said a replica has them.
    net.take_output(Net::cmd(0));
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let due = net.ep.poll_timeout().expect("a reconnect is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    net.take_output(Net::cmd(0));
    net.answer_setup(0, INFO_82, 'a', false);
    assert_eq!(
        words(&net.take_output(Net::cmd(0))),
        ["LUA", "LUA", "LUA", "WAIT"],
        "one WAIT after the cleanups sent again"
    );
    // It falls short: every one is still owed.
    net.reply(Net::cmd(0), b":1\r\n:1\r\n:1\r\n:0\r\n");
    assert_eq!(net.ep.undelivered(net.now), [0]);
    // The next says a replica has every one.
    let due = net.ep.poll_timeout().expect("the next WAIT is due");
    net.now = due;
    net.ep.handle_timeout(net.now);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["WAIT"]);
    net.reply(Net::cmd(0), b":1\r\n");
    assert!(net.ep.undelivered(net.now).is_empty());
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
}

/// A node whose setup was refused votes with that refusal while its connection is set up again:
/// queued behind the new setup, the vote came only once the setup was refused again, after the
/// round was decided, and a wait on a quorum that too few nodes accept ended as contention
/// (the simulation's seed 139 of its model runs).
#[test]
fn a_node_refused_before_votes_its_refusal_while_it_is_set_up_again() {
    let mut net = Net::new(1);
    let caller = net.ep.open_caller();
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    assert_eq!(net.connect_all(), [Net::cmd(0)]);
    net.take_output(Net::cmd(0));
    net.reply(
        Net::cmd(0),
        b"-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n",
    );
    assert_eq!(net.ep.poll_io(), Some(Io::Close(Net::cmd(0))));
    net.ep.finish(caller, run, net.now);
    // Once the backoff passed, the next command starts a new connection, and fails at once.
    let due = net.ep.poll_timeout().unwrap_or(net.now);
    net.now = due.max(net.now) + 10_000 * MS;
    let run = net.ep.begin(caller);
    let mut m = Probe::new(What::Subscribe, None);
    net.step(caller, run, &mut m);
    assert_eq!(net.connect_all(), [Net::cmd(0)], "the setup is tried again");
    assert!(
        matches!(m.failures.as_slice(), [(0, NodeErrorKind::Setup { .. })]),
        "the vote waits for the new setup: {:?}",
        m.failures
    );
    assert_eq!(net.ep.setup_failures().len(), 1);
    net.ep.finish(caller, run, net.now);
}

/// A node that answered a holder's give-back (a semaphore's slot granted beyond its quorum,
/// the same compare-and-delete as its release) holds nothing of it: the holder's release is
/// answered there at once, and nothing is sent. One still on its way is the release's: its
/// answer is. Not a give-back answered with an error, nor once the connection failed since
/// (the next one may reach a restarted server).
#[test]
fn a_release_where_the_give_back_was_answered_is_answered_at_once() {
    let mut net = Net::ready(INFO_82, false);
    let caller = net.ep.open_caller();
    let until = net.now + 10_000 * MS;
    let give_back = |net: &mut Net, token: Token, reply: &[u8]| {
        let run = net.ep.begin(caller);
        let mut give = Probe::new(What::GiveBack { token }, Some(until));
        give.tag = None;
        net.step(caller, run, &mut give);
        assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
        if !reply.is_empty() {
            net.reply(Net::cmd(0), reply);
        }
        net.ep.finish(caller, run, net.now);
    };
    let release = |net: &mut Net, token: Token| -> (Vec<String>, Probe) {
        let run = net.ep.begin(caller);
        let mut release = Probe::new(What::Release { token }, Some(until));
        net.step(caller, run, &mut release);
        net.step(caller, run, &mut release);
        let sent = words(&net.take_output(Net::cmd(0)));
        net.ep.finish(caller, run, net.now);
        (sent, release)
    };
    // Answered: the release is answered at once, nothing goes out.
    let a = Token::from_random([8; 20]);
    give_back(&mut net, a, b":1\r\n");
    let (sent, r) = release(&mut net, a);
    assert!(sent.is_empty(), "sent {sent:?}");
    assert_eq!(r.replies, [(0, "Integer(1)".to_owned())]);
    // Once only: a second release of the same token goes.
    let (sent, _) = release(&mut net, a);
    assert_eq!(sent, ["LUA"]);
    net.reply(Net::cmd(0), b":0\r\n");
    // Not answered yet: nothing goes, and its answer is the release's.
    let b = Token::from_random([9; 20]);
    give_back(&mut net, b, b"");
    let run = net.ep.begin(caller);
    let mut r = Probe::new(What::Release { token: b }, Some(until));
    net.step(caller, run, &mut r);
    assert!(!net.ep.wants_write(Net::cmd(0)), "the release was queued");
    net.reply(Net::cmd(0), b":1\r\n");
    net.step(caller, run, &mut r);
    assert_eq!(r.replies, [(0, "Integer(1)".to_owned())]);
    net.ep.finish(caller, run, net.now);
    assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    // Answered with an error: it did not run, the release goes.
    let c = Token::from_random([10; 20]);
    give_back(&mut net, c, b"-ERR something\r\n");
    let (sent, _) = release(&mut net, c);
    assert_eq!(sent, ["LUA"]);
    net.reply(Net::cmd(0), b":0\r\n");
    // Answered, then the connection failed: the release is not answered at once.
    let d = Token::from_random([11; 20]);
    give_back(&mut net, d, b":1\r\n");
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let (_, r) = release(&mut net, d);
    assert!(r.replies.is_empty(), "{:?}", r.replies);
    // On its way when the connection failed: owed for the next one, and the release is not
    // answered at once either.
    net.now += 1_000 * MS;
    let e = Token::from_random([12; 20]);
    let run = net.ep.begin(caller);
    let mut give = Probe::new(What::GiveBack { token: e }, Some(until));
    give.tag = None;
    net.step(caller, run, &mut give);
    net.ep.finish(caller, run, net.now);
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    let (_, r) = release(&mut net, e);
    assert!(r.replies.is_empty(), "{:?}", r.replies);
}

#[test]
fn replies_still_to_come_wait_for_the_next_call_but_a_release_to_send_again_does_not() {
    use super::seats::{Resender, ResenderTurn, Seats};
    let mut net = Net::ready(INFO_82, false);
    let mut seats: Seats<u32, ()> = Seats::new();
    let caller = seats.sit(&mut net.ep, 1);
    let run = net.ep.begin(caller);
    let token = Token::from_random([9; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    // Its owner returns at the quorum (won elsewhere): the release's reply is still to come.
    net.ep.finish(caller, run, net.now);
    seats.leave(caller);
    seats.resender = Resender::Running(7);
    assert!(net.ep.needs_tending(net.now));
    // The resender, awake, takes a short look rather than driving it at once; a caller that
    // finishes meanwhile does not wake it.
    let start = net.now;
    let turn = seats.resender_turn(&net.ep, || 7, net.now, net.now);
    let ResenderTurn::Look(look) = turn else {
        panic!("the resender drives replies still to come at once: {turn:?}");
    };
    assert!(look > Duration::ZERO && look <= 50 * MS, "{look:?}");
    assert!(!net.ep.tending_urgent(net.now));
    assert_eq!(seats.resender_after(&net.ep, net.now), (None, false));
    // Woken early, it looks on; once the whole look went by with no caller, it drives them.
    net.now += look / 2;
    assert!(matches!(
        seats.resender_turn(&net.ep, || 7, net.now, start),
        ResenderTurn::Look(_)
    ));
    net.now = start + look;
    assert_eq!(
        seats.resender_turn(&net.ep, || 7, net.now, start),
        ResenderTurn::Work
    );
    // The connection breaks: the release is to send again, which wakes the resender at once.
    net.ep.handle_failed(
        Net::cmd(0),
        NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset),
        net.now,
    );
    assert!(net.ep.tending_urgent(net.now));
    let _ = seats.resender_turn(&net.ep, || 7, net.now, start);
    assert_eq!(seats.resender_after(&net.ep, net.now), (Some(7), false));
    assert_eq!(
        seats.resender_turn(&net.ep, || 7, net.now, start),
        ResenderTurn::Work
    );
}

/// A release whose `WAIT` fell short stays owed, but not until its connection breaks: the
/// master ran it, and a later `WAIT` on the same connection says whether the replicas have it
/// now (`WAIT` acknowledges every earlier write of its connection). The endpoint sends its own
/// once the connection is idle, after a backoff that grows while they fall short, as for a
/// lost attempt's cleanup; one that says enough delivers it. Bounded: once what it deletes
/// has expired, nothing is owed and no `WAIT` goes.
#[test]
fn a_release_whose_wait_fell_short_is_confirmed_by_a_later_wait_on_its_connection() {
    for confirmed in [true, false] {
        let (mut net, caller, run) = waiting_net();
        let token = Token::from_random([9; 20]);
        let mut release = Probe::new(What::Release { token }, Some(net.now + 1_000 * MS));
        net.step(caller, run, &mut release);
        assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA", "WAIT"]);
        net.reply(Net::cmd(0), b":1\r\n:0\r\n");
        net.step(caller, run, &mut release);
        assert_eq!(release.failures.len(), 1, "{:?}", release.failures);
        assert_eq!(net.ep.undelivered(net.now), [0]);
        net.ep.finish(caller, run, net.now);
        // The endpoint's own `WAIT`s, after a backoff each, while they fall short.
        let mut waits = 0;
        let mut last = net.now;
        while waits < 4 {
            let due = net
                .ep
                .poll_timeout()
                .expect("a WAIT for the release is due on its connection");
            assert!(due > net.now, "a WAIT at once after one fell short");
            net.now = due;
            net.ep.handle_timeout(net.now);
            let out = words(&net.take_output(Net::cmd(0)));
            if out.is_empty() {
                continue;
            }
            assert_eq!(out, ["WAIT"], "only a WAIT: the master has the release");
            assert!(net.now - last >= 10 * MS, "a backoff between WAITs");
            last = net.now;
            waits += 1;
            net.reply(Net::cmd(0), b":0\r\n");
            assert_eq!(
                net.ep.undelivered(net.now),
                [0],
                "after a WAIT that fell short"
            );
        }
        if confirmed {
            // The replica is back: the next `WAIT` says it has every earlier write.
            let due = net.ep.poll_timeout().expect("the next WAIT is due");
            net.now = due;
            net.ep.handle_timeout(net.now);
            assert_eq!(words(&net.take_output(Net::cmd(0))), ["WAIT"]);
            net.reply(Net::cmd(0), b":1\r\n");
        } else {
            // Never acknowledged: once what it deletes expired, it is let go.
            let mut sent = 0;
            for _ in 0..64 {
                let Some(due) = net.ep.poll_timeout() else {
                    break;
                };
                net.now = due.max(net.now + MS);
                net.ep.handle_timeout(net.now);
                if !net.take_output(Net::cmd(0)).is_empty() {
                    sent += 1;
                    net.reply(Net::cmd(0), b":0\r\n");
                }
            }
            assert!(sent < 64, "WAITs without end");
            assert!(net.now < Instant::now() + 2_000 * MS + 10_000 * MS);
        }
        assert!(
            net.ep.undelivered(net.now).is_empty(),
            "confirmed {confirmed}"
        );
        assert!(!net.ep.busy(net.now) && !net.ep.needs_tending(net.now));
    }
}

#[test]
fn a_tending_caller_runs_the_timers_first_then_ends_its_close_or_waits() {
    use super::seats::{Seats, Tend, Tending};
    let mut net = Net::ready(INFO_82, false);
    let mut seats: Seats<u32, ()> = Seats::new();
    let caller = seats.sit(&mut net.ep, 1);
    let run = net.ep.begin(caller);
    let token = Token::from_random([9; 20]);
    let mut release = Probe::new(What::Release { token }, Some(net.now + 10_000 * MS));
    net.step(caller, run, &mut release);
    assert_eq!(words(&net.take_output(Net::cmd(0))), ["LUA"]);
    net.ep.finish(caller, run, net.now);
    // The resender, with a release's reply owed: the timers, then a short wait, each turn;
    // its work is over once the client's last handle is gone.
    let mut resend = Tending::resend(net.now);
    assert!(resend.turn_starts());
    assert_eq!(
        resend.next(Some(&seats), &mut net.ep, net.now, false),
        Tend::Timers
    );
    assert!(!resend.turn_starts());
    let Tend::Wait(d) = resend.next(Some(&seats), &mut net.ep, net.now, false) else {
        panic!("the resender does not wait after its timers");
    };
    assert!(d > Duration::ZERO && d <= 50 * MS, "{d:?}");
    assert_eq!(
        resend.next(Some(&seats), &mut net.ep, net.now, true),
        Tend::Done(Vec::new())
    );
    // A close while the reply is owed: the timers, the closing's end looked at, a wait
    // between 1 and 20 ms; once the closing ends (the reply never came, the limit passed),
    // the close is over with what it left.
    let mut close = Tending::close(&mut seats, &mut net.ep, caller, net.now);
    assert_eq!(
        close.next(Some(&seats), &mut net.ep, net.now, false),
        Tend::Timers
    );
    assert_eq!(
        close.next(Some(&seats), &mut net.ep, net.now, false),
        Tend::EndClose
    );
    let mut wake = Vec::new();
    seats.end_close(&mut net.ep, net.now, &mut wake);
    let Tend::Wait(d) = close.next(Some(&seats), &mut net.ep, net.now, false) else {
        panic!("a close ended while a reply was owed");
    };
    assert!(d >= MS && d <= 20 * MS, "{d:?}");
    let mut turns = 0;
    let left = loop {
        turns += 1;
        assert!(turns < 10_000, "a close that never ends");
        net.now += 20 * MS;
        match close.next(Some(&seats), &mut net.ep, net.now, false) {
            Tend::Timers => {
                net.ep.handle_timeout(net.now);
                while net.ep.poll_io().is_some() {}
            }
            Tend::EndClose => seats.end_close(&mut net.ep, net.now, &mut wake),
            Tend::Wait(_) => {}
            Tend::Done(left) => break left,
        }
    };
    assert_eq!(left, [0]);
}

#[test]
fn a_warm_up_ends_once_settled_or_runs_the_timers_at_its_deadline_and_a_settling_at_its_outcome() {
    use super::seats::{Seats, Tend, Tending};
    const NONE: Option<&Seats<u32, ()>> = None;
    // Nothing set up yet: a wait until the connect timeout at most, the timers after it.
    let mut net = Net::new(1);
    net.ep.connect_all(net.now);
    let mut warm = Tending::warm_up(net.now, 500 * MS);
    let Tend::Wait(d) = warm.next(NONE, &mut net.ep, net.now, false) else {
        panic!("a warm-up that does not wait for its connects");
    };
    assert!(d > Duration::ZERO && d <= 500 * MS, "{d:?}");
    assert!(!warm.turn_starts());
    assert_eq!(warm.next(NONE, &mut net.ep, net.now, false), Tend::Timers);
    // Its deadline passed: the timers once more, then it ends.
    net.now += 500 * MS;
    assert_eq!(warm.next(NONE, &mut net.ep, net.now, false), Tend::Timers);
    assert_eq!(
        warm.next(NONE, &mut net.ep, net.now, false),
        Tend::Done(Vec::new())
    );
    // Set up: over at once.
    let mut net = Net::ready(INFO_82, false);
    let mut warm = Tending::warm_up(net.now, 500 * MS);
    assert_eq!(
        warm.next(NONE, &mut net.ep, net.now, false),
        Tend::Done(Vec::new())
    );
    // Nothing owed: a settling is over at once, with nothing undelivered.
    let mut settle = Tending::settle(&mut net.ep, net.now);
    assert_eq!(
        settle.next(NONE, &mut net.ep, net.now, false),
        Tend::Done(Vec::new())
    );
}
