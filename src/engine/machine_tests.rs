//! The engine's state machines under virtual time, driven as a driver or a simulation drives
//! them: poll the transmits, encode them, feed chosen replies, failures, wake messages and
//! deadlines back. No socket, no clock, no OS randomness.

use std::time::{Duration, Instant};

use rand_core::SeedableRng;

use crate::config::{Config, RwPolicy};
use crate::engine::acquire::{Acquisition, Grant, Params};
use crate::engine::hold::{Hold, HoldRound, Step};
use crate::engine::keys::{fence_key, RwKeys};
use crate::engine::kind::{Keys, Spec};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::{Caps, ScriptForm};
use crate::engine::round::Round;
use crate::engine::validity::{self, Timing};
use crate::error::{Deadline, Error, NodeErrorKind};
use crate::resp::{self, Limits, Reply, Status, Value};
use crate::rng::{Jitter, Token};
use crate::url::NodeAddr;

const MS: Duration = Duration::from_millis(1);
const TTL_MS: u64 = 10_000;

fn config(nodes: usize, retry_count: u32) -> Config {
    Config {
        nodes: (0..nodes)
            .map(|i| NodeAddr::parse(&format!("127.0.0.1:{}", 7000 + i)).unwrap())
            .collect(),
        node_timeout: 50 * MS,
        connect_timeout: 1000 * MS,
        dead_peer_timeout: Duration::from_secs(3),
        retry_count,
        retry_delay: 50 * MS,
        wait_timeout: 10_000 * MS,
        drift_factor: 0.01,
        fair: false,
        fair_after: Duration::ZERO,
        limits: Limits::default(),
        rw_policy: RwPolicy::ReadPreferring,
        masters: Default::default(),
    }
}

fn params(wait: bool) -> Params {
    Params {
        ttl_ms: TTL_MS,
        timing: Timing {
            ttl: Duration::from_millis(TTL_MS),
            drift_factor: 0.01,
        },
        wait,
        fair: false,
        ticket: 0,
        spread: Duration::ZERO,
    }
}

/// A transmit as it went out: where, with which tag, and its command's arguments.
#[derive(Debug)]
struct Sent {
    to: To,
    tag: Option<Tag>,
    form: ScriptForm,
    what: What,
    args: Vec<Vec<u8>>,
}

impl Sent {
    fn name(&self) -> &[u8] {
        &self.args[0]
    }
}

/// Every transmit `m` has now, encoded for a node without `DELEX`.
fn sent(m: &mut impl Machine) -> Vec<Sent> {
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit() {
        out.push(encoded(m, &t));
    }
    out
}

fn encoded(m: &impl Machine, t: &Transmit) -> Sent {
    let mut bytes = Vec::new();
    m.encode(t, Caps::default(), &mut bytes);
    let Ok(Status::Complete((reply, _))) = resp::decode(&bytes, &Limits::default()) else {
        panic!("not a command: {bytes:?}");
    };
    let Value::Array(Some(items)) = reply.to_value() else {
        panic!("not an array");
    };
    let args = items
        .into_iter()
        .map(|v| match v {
            Value::Bulk(Some(b)) => b,
            other => panic!("not a bulk string: {other:?}"),
        })
        .collect();
    Sent {
        to: t.to,
        tag: t.tag,
        form: t.form,
        what: t.what,
        args,
    }
}

fn token_of(what: What) -> Token {
    match what {
        What::Acquire { token } | What::Cleanup { token } => token,
        other => panic!("no attempt token in {other:?}"),
    }
}

const NIL: Reply<'static> = Reply::Bulk(None);
const OK: Reply<'static> = Reply::Simple(b"OK");

#[test]
fn a_free_lock_is_one_transmit_to_every_node_and_won_at_the_quorum() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([1; 32]));
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(true), t0, round, &mut rng);
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "{out:?}");
    let (tag, attempt) = (out[0].tag.expect("tagged"), &out[0]);
    assert_eq!((attempt.to, attempt.name()), (To::All, &b"SET"[..]));
    let token = token_of(attempt.what);
    assert_eq!(attempt.args[2], token.as_bytes());
    // The attempt waits until its validity; a silent node is failed by the driver.
    assert!(m
        .poll_timeout()
        .is_some_and(|t| t > t0 + config.node_timeout));
    m.handle_reply(0, tag, &OK, t0 + MS, &mut rng);
    assert!(m.poll_outcome().is_none());
    m.handle_reply(2, tag, &OK, t0 + 2 * MS, &mut rng);
    let grant: Grant = m.poll_outcome().expect("done").expect("won");
    assert_eq!(grant.token, token);
    assert!(grant.valid_until < t0 + Duration::from_millis(TTL_MS));
    // The straggler is read and dropped; nothing else goes out.
    m.handle_reply(1, tag, &OK, t0 + 3 * MS, &mut rng);
    assert!(sent(&mut m).is_empty());
    assert_eq!(m.poll_timeout(), None);
}

/// Loses an attempt tagged `tag` on every node, refused.
fn refuse_all(m: &mut Acquisition<'_>, tag: Tag, now: Instant, rng: &mut Jitter) {
    for node in 0..3 {
        m.handle_reply(node, tag, &NIL, now, rng);
    }
}

#[test]
fn a_lost_attempt_is_undone_then_retried_with_a_fresh_token_once_subscribed() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([2; 32]));
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(true), t0, round, &mut rng);
    let first = sent(&mut m).remove(0);
    refuse_all(&mut m, first.tag.unwrap(), t0 + MS, &mut rng);
    let out = sent(&mut m);
    // Redlock step 5, pipelined behind the attempt, with the script's body so that no reply
    // needs reading; then the subscription to the wake channel.
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!((out[0].to, out[0].tag), (To::All, None));
    assert_eq!(
        (out[0].form, out[0].name()),
        (ScriptForm::Body, &b"EVAL"[..])
    );
    assert_eq!(token_of(out[0].what), token_of(first.what));
    assert_eq!(out[1].to, To::Subscribers);
    assert_eq!(out[1].args, [&b"SUBSCRIBE"[..], b"redlock-mux:wake:k"]);
    assert_eq!(m.poll_timeout(), Some(t0 + MS + config.node_timeout));
    m.handle_subscribed(t0 + 2 * MS, &mut rng);
    let second = sent(&mut m).remove(0);
    assert_eq!(second.name(), b"SET");
    assert_ne!(token_of(second.what), token_of(first.what));
    assert!(second.tag > first.tag);
    // A reply to the first attempt that comes late changes nothing.
    m.handle_reply(0, first.tag.unwrap(), &OK, t0 + 3 * MS, &mut rng);
    m.handle_reply(0, second.tag.unwrap(), &OK, t0 + 3 * MS, &mut rng);
    m.handle_reply(1, second.tag.unwrap(), &OK, t0 + 3 * MS, &mut rng);
    let grant = m.poll_outcome().expect("done").expect("won");
    assert_eq!(grant.token, token_of(second.what));
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].args, [&b"UNSUBSCRIBE"[..], b"redlock-mux:wake:k"]);
}

/// A waiter that lost twice (the second time after subscribing), now waiting for a wake.
fn waiting<'a>(config: &'a Config, rng: &mut Jitter, t0: Instant) -> (Acquisition<'a>, Sent) {
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, config, params(true), t0, round, rng);
    let first = sent(&mut m).remove(0);
    refuse_all(&mut m, first.tag.unwrap(), t0, rng);
    let _ = sent(&mut m);
    m.handle_subscribed(t0, rng);
    let second = sent(&mut m).remove(0);
    refuse_all(&mut m, second.tag.unwrap(), t0, rng);
    let cleanup = sent(&mut m);
    assert_eq!(cleanup.len(), 1);
    (m, second)
}

#[test]
fn only_a_release_on_the_lock_s_channel_from_a_refusing_node_wakes_a_waiter() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([3; 32]));
    let (mut m, second) = waiting(&config, &mut rng, t0);
    let second_token = token_of(second.what);
    let own = &second_token.as_bytes()[..16];
    let now = t0 + MS;
    // Its own cleanup's announcement, another lock's channel, a node out of range: no retry.
    m.handle_wake(0, b"redlock-mux:wake:k", own, now, &mut rng);
    m.handle_wake(
        0,
        b"redlock-mux:wake:other",
        b"0123456789abcdef",
        now,
        &mut rng,
    );
    m.handle_wake(
        70,
        b"redlock-mux:wake:k",
        b"0123456789abcdef",
        now,
        &mut rng,
    );
    assert!(sent(&mut m).is_empty());
    // Someone else's release: at once.
    m.handle_wake(1, b"redlock-mux:wake:k", b"0123456789abcdef", now, &mut rng);
    let third = sent(&mut m);
    assert_eq!(third.len(), 1, "{third:?}");
    assert_eq!(third[0].name(), b"SET");
}

/// A waiter woken by one node's announcement of a release retries at once; a node that had
/// not run the release yet refuses that retry, runs the release right after, and announces
/// it at the same instant as far as the waiter can tell. Those announcements may come during
/// the retry or after it was lost: either way they are news for it, and the waiter tries
/// again soon, not at its backstop.
#[test]
fn a_release_announced_by_a_node_after_it_refused_the_retry_it_woke_is_not_missed() {
    for late_during_attempt in [false, true] {
        let mut config = config(3, 5);
        config.retry_delay = 10_000 * MS;
        let (t0, mut rng) = (Instant::now(), Jitter::from_seed([9; 32]));
        let (mut m, _) = waiting(&config, &mut rng, t0);
        let backstop = m.poll_timeout().expect("a backstop");
        let (chan, release) = (&b"redlock-mux:wake:k"[..], &b"0123456789abcdef"[..]);
        let now = t0 + MS;
        m.handle_wake(0, chan, release, now, &mut rng);
        let third = sent(&mut m).remove(0);
        assert_eq!(third.name(), b"SET");
        let tag = third.tag.unwrap();
        if late_during_attempt {
            m.handle_wake(1, chan, release, now, &mut rng);
            m.handle_wake(2, chan, release, now, &mut rng);
        }
        // Node 0 ran the release before the retry; nodes 1 and 2 after it.
        m.handle_reply(0, tag, &OK, now, &mut rng);
        m.handle_reply(1, tag, &NIL, now, &mut rng);
        m.handle_reply(2, tag, &NIL, now, &mut rng);
        assert!(m.poll_outcome().is_none(), "a split vote is no outcome");
        let cleanup = sent(&mut m);
        assert_eq!(cleanup.len(), 1, "{cleanup:?}");
        if !late_during_attempt {
            m.handle_wake(1, chan, release, now, &mut rng);
            m.handle_wake(2, chan, release, now, &mut rng);
        }
        let mut out = sent(&mut m);
        if out.is_empty() {
            // A short pause after the split vote, within the spread, is fine.
            let at = m.poll_timeout().expect("a deadline");
            assert!(
                at < now + 100 * MS,
                "late_during_attempt={late_during_attempt}: next try at {:?} after the \
                 announcements, the backstop is at {:?}",
                at - now,
                backstop - now
            );
            m.handle_timeout(at, &mut rng);
            out = sent(&mut m);
        }
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].name(), b"SET");
    }
}

/// One waiter's view of three mutex nodes: each holds a lock's value or nothing. An attempt
/// takes a free node; a cleanup deletes the attempt's own value and announces that release.
/// Runs `s` on `node`: the reply to an attempt, and whether the node announced a release.
fn run_on(
    held: &mut [Option<Vec<u8>>; 3],
    node: usize,
    s: &Sent,
) -> (Option<Reply<'static>>, bool) {
    let slot = &mut held[node];
    match s.what {
        What::Acquire { token } if slot.is_none() => {
            *slot = Some(token.as_bytes().to_vec());
            (Some(OK), false)
        }
        What::Acquire { .. } => (Some(NIL), false),
        What::Cleanup { token } if slot.as_deref() == Some(token.as_bytes()) => {
            *slot = None;
            (None, true)
        }
        _ => (None, false),
    }
}

/// A waiter retries at once when its attempt is lost to refusals while a node that granted it
/// has not answered yet. That node holds the lost attempt's value until its cleanup runs there;
/// the cleanup goes ahead of the retry, or the retry meets the waiter's own lock, is refused,
/// and the release that follows is the waiter's own, which wakes nobody: it would sleep out its
/// backstop while the lock is free.
#[test]
fn a_retry_never_meets_the_lock_of_the_attempt_it_replaces() {
    let mut config = config(3, 5);
    config.retry_delay = 10_000 * MS;
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([13; 32]));
    let (mut m, _) = waiting(&config, &mut rng, t0);
    let holder = &b"0123456789abcdef"[..];
    let mut held = [
        Some(holder.to_vec()),
        Some(holder.to_vec()),
        Some(holder.to_vec()),
    ];
    let now = t0 + MS;
    // The holder's release has reached node 0: the waiter retries.
    held[0] = None;
    m.handle_wake(0, WAKE_K, holder, now, &mut rng);
    let third = sent(&mut m).remove(0);
    let tag = third.tag.unwrap();
    let replies: Vec<_> = (0..3).map(|n| run_on(&mut held, n, &third).0).collect();
    assert_eq!(replies, [Some(OK), Some(NIL), Some(NIL)]);
    // The release reaches node 1 after the attempt did, and is announced; nodes 1 and 2 answer
    // first: lost, with news from a node that refused it.
    held[1] = None;
    m.handle_wake(1, WAKE_K, holder, now, &mut rng);
    m.handle_reply(1, tag, &NIL, now, &mut rng);
    m.handle_reply(2, tag, &NIL, now, &mut rng);
    assert!(m.poll_outcome().is_none());
    // What the waiter sends now reaches each node in order.
    let out = sent(&mut m);
    let retry = out
        .iter()
        .find(|s| matches!(s.what, What::Acquire { .. }))
        .expect("a retry at once");
    let mut answers = Vec::new();
    let mut announced = Vec::new();
    for s in &out {
        for node in 0..3 {
            let (reply, release) = run_on(&mut held, node, s);
            if let (Some(reply), Some(_)) = (reply, s.tag) {
                answers.push((node, reply));
            }
            if release {
                announced.push((node, token_of(s.what)));
            }
        }
    }
    // Node 0's grant of the lost attempt arrives late; its cleanup's announcement, the
    // waiter's own, comes too; then the retry's answers.
    m.handle_reply(0, tag, &OK, now + MS, &mut rng);
    for (node, token) in announced {
        m.handle_wake(node, WAKE_K, &token.as_bytes()[..16], now + MS, &mut rng);
    }
    for (node, reply) in &answers {
        m.handle_reply(*node, retry.tag.unwrap(), reply, now + 2 * MS, &mut rng);
    }
    let Some(outcome) = m.poll_outcome() else {
        panic!(
            "the lock is free on nodes 0 and 1, yet the retry got {answers:?} and the waiter \
             tries next in {:?}",
            m.poll_timeout().map(|t| t - now)
        );
    };
    assert_eq!(outcome.expect("won").token, token_of(retry.what));
}

#[test]
fn only_retries_after_the_backstop_count_and_the_retry_count_ends_the_wait() {
    let config = config(3, 1);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([4; 32]));
    let (mut m, _) = waiting(&config, &mut rng, t0);
    let backstop = m.poll_timeout().expect("a backstop");
    assert!(
        backstop >= t0 + 25 * MS && backstop < t0 + 75 * MS,
        "{backstop:?}"
    );
    // Not yet.
    m.handle_timeout(backstop - MS, &mut rng);
    assert!(sent(&mut m).is_empty());
    m.handle_timeout(backstop, &mut rng);
    let third = sent(&mut m).remove(0);
    refuse_all(&mut m, third.tag.unwrap(), backstop, &mut rng);
    let error = m.poll_outcome().expect("done").expect_err("lost");
    assert_eq!(error.deadline(), Some(Deadline::RetryCount), "{error:?}");
    assert!(error.is_contended(), "{error}");
    let out = sent(&mut m);
    let names: Vec<&[u8]> = out.iter().map(Sent::name).collect();
    assert_eq!(names, [&b"EVAL"[..], b"UNSUBSCRIBE"], "the cleanup, then");
}

#[test]
fn one_attempt_returns_its_own_error_and_a_config_error_ends_a_wait_at_once() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([5; 32]));
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let round = || Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(false), t0, round(), &mut rng);
    let tag = sent(&mut m)[0].tag.unwrap();
    refuse_all(&mut m, tag, t0, &mut rng);
    let error = m.poll_outcome().expect("done").expect_err("lost");
    assert!(matches!(error, Error::Contended { .. }), "{error:?}");

    let mut m = Acquisition::new(spec, &config, params(true), t0, round(), &mut rng);
    let tag = sent(&mut m)[0].tag.unwrap();
    let setup = || NodeErrorKind::Setup {
        command: "AUTH",
        cause: Box::new(NodeErrorKind::UnexpectedReply),
    };
    m.handle_failure(0, tag, setup(), t0, &mut rng);
    m.handle_failure(1, tag, setup(), t0, &mut rng);
    let error = m.poll_outcome().expect("done at once").expect_err("lost");
    assert!(error.is_config(), "{error:?}");
}

#[test]
fn a_node_without_the_script_gets_its_body_before_the_attempt_is_undone() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([6; 32]));
    let keys = RwKeys::new(b"doc");
    let spec = Spec {
        keys: Keys::Read {
            resource: b"doc",
            keys: &keys,
        },
        fence: None,
    };
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(true), t0, round, &mut rng);
    let attempt = sent(&mut m).remove(0);
    let tag = attempt.tag.unwrap();
    assert_eq!(attempt.name(), b"EVALSHA");
    m.handle_reply(
        2,
        tag,
        &Reply::Error(b"NOSCRIPT No matching script"),
        t0,
        &mut rng,
    );
    m.handle_reply(0, tag, &Reply::Integer(0), t0, &mut rng);
    m.handle_reply(1, tag, &Reply::Integer(0), t0, &mut rng);
    // Decided (two refusals), but node 2 is sent the body first, under the same tag, and the
    // cleanup waits until it has answered.
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!((out[0].to, out[0].tag), (To::Node(2), Some(tag)));
    assert_eq!(
        (out[0].form, out[0].name()),
        (ScriptForm::Body, &b"EVAL"[..])
    );
    m.handle_reply(2, tag, &Reply::Integer(1), t0 + MS, &mut rng);
    let out = sent(&mut m);
    assert_eq!(
        (out[0].to, out[0].tag),
        (To::All, None),
        "the cleanup: {out:?}"
    );

    // A second NOSCRIPT from a node already sent the body is a failure, not another resend.
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(false), t0, round, &mut rng);
    let tag = sent(&mut m)[0].tag.unwrap();
    let noscript = Reply::Error(b"NOSCRIPT No matching script");
    m.handle_reply(0, tag, &noscript, t0, &mut rng);
    assert_eq!(sent(&mut m)[0].to, To::Node(0));
    m.handle_reply(0, tag, &noscript, t0, &mut rng);
    m.handle_reply(1, tag, &Reply::Integer(0), t0, &mut rng);
    // Decided, and still open for node 2, which may want the body too.
    assert!(m.poll_outcome().is_none());
    m.handle_reply(2, tag, &Reply::Integer(0), t0, &mut rng);
    assert!(sent(&mut m).iter().all(|s| s.to != To::Node(0)));
    let error = m.poll_outcome().expect("done").expect_err("lost");
    let failed: Vec<_> = error.failures().iter().map(|f| (f.node, &f.kind)).collect();
    assert_eq!(failed, [(0, &NodeErrorKind::UnexpectedReply)], "{error:?}");
}

#[test]
fn a_fenced_grant_whose_counters_disagree_is_written_back_before_it_is_given() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([7; 32]));
    let fence = fence_key(b"ledger");
    let spec = Spec {
        keys: Keys::Mutex(b"ledger"),
        fence: Some(&fence),
    };
    let round = Round::new(3, t0, None, None);
    let mut m = Acquisition::new(spec, &config, params(true), t0, round, &mut rng);
    let tag = sent(&mut m)[0].tag.unwrap();
    m.handle_reply(0, tag, &Reply::Integer(5), t0 + MS, &mut rng);
    m.handle_reply(1, tag, &Reply::Integer(7), t0 + MS, &mut rng);
    assert!(m.poll_outcome().is_none(), "7 is on one node only");
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "{out:?}");
    let write = &out[0];
    assert!(
        matches!(write.what, What::FenceWrite { value: 7, .. }),
        "{write:?}"
    );
    assert_ne!(write.tag, Some(tag));
    m.handle_reply(
        0,
        write.tag.unwrap(),
        &Reply::Integer(1),
        t0 + 2 * MS,
        &mut rng,
    );
    m.handle_reply(
        2,
        write.tag.unwrap(),
        &Reply::Integer(1),
        t0 + 2 * MS,
        &mut rng,
    );
    let grant = m.poll_outcome().expect("done").expect("won");
    assert_eq!(grant.fencing_token, Some(7));
}

#[test]
fn a_failed_extend_never_leaves_more_validity_than_the_nodes_may_hold() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([8; 32]));
    let mut hold = Hold::new(t0 + 9_000 * MS);
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let token = Token::from_random([9; 20]);
    let timing = Timing {
        ttl: 300 * MS,
        drift_factor: 0.01,
    };
    let step = Step::Extend {
        ttl_ms: 300,
        timing,
    };
    let round = Round::new(3, t0, None, None);
    let start = t0 + 10 * MS;
    let mut m: HoldRound<'_> = hold.round(spec, token, &config, step, start, round);
    let tag = sent(&mut m)[0].tag.unwrap();
    m.handle_reply(0, tag, &Reply::Integer(1), start + MS, &mut rng);
    // Nodes 1 and 2 stay silent: the driver fails them at their node timeout.
    let at = start + config.node_timeout;
    for node in [1, 2] {
        m.handle_failure(node, tag, NodeErrorKind::Timeout, at, &mut rng);
    }
    let error = m.poll_outcome().expect("done").expect_err("no quorum");
    assert_eq!(error.deadline(), Some(Deadline::NodeTimeout), "{error:?}");
    drop(m);
    assert_eq!(hold.valid_until(), timing.valid_until(start).unwrap());

    // Asked for after the validity ended: nothing is sent.
    let round = Round::new(3, t0, None, None);
    let late = t0 + 10_000 * MS;
    let mut m = hold.round(spec, token, &config, step, late, round);
    assert!(sent(&mut m).is_empty());
    let error = m.poll_outcome().expect("done").expect_err("expired");
    assert_eq!(error.deadline(), Some(Deadline::Validity));
}

/// An extend that shortens the TTL, lost, while a slow node that answered `NOSCRIPT` is still
/// being sent the body: the nodes that ran it hold the lock only until the TTL it asked for,
/// so the holder learns its validity is over then, not once the slow node answers (SlowFlush,
/// read-write locks, seed 224).
#[test]
fn an_extend_serving_a_noscript_straggler_still_ends_with_its_validity() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([8; 32]));
    let mut hold = Hold::new(t0 + 30 * MS);
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let token = Token::from_random([9; 20]);
    let timing = Timing {
        ttl: 20 * MS,
        drift_factor: 0.01,
    };
    let step = Step::Extend { ttl_ms: 20, timing };
    let round = Round::new(3, t0, None, None);
    let mut m: HoldRound<'_> = hold.round(spec, token, &config, step, t0, round);
    let tag = sent(&mut m)[0].tag.unwrap();
    m.handle_reply(1, tag, &Reply::Integer(1), t0 + MS, &mut rng);
    m.handle_reply(2, tag, &Reply::Integer(0), t0 + MS, &mut rng);
    // The slow node answers NOSCRIPT, and is sent the body.
    let noscript = Reply::Error(b"NOSCRIPT No matching script");
    m.handle_reply(0, tag, &noscript, t0 + 10 * MS, &mut rng);
    assert_eq!(sent(&mut m)[0].to, To::Node(0));
    // Node 1 may hold the lock only until the TTL asked for: the round must be over then.
    let cap = validity::failed_extend_cap(t0, timing);
    let due = m.poll_timeout().expect("a deadline");
    assert!(due <= cap, "{:?} after {:?}", due - t0, cap - t0);
    m.handle_timeout(due, &mut rng);
    let outcome = m.poll_outcome();
    assert!(
        matches!(outcome, Some(Err(Error::ValidityExpired { .. }))),
        "the extend is still open at the end of what the nodes hold: {outcome:?}"
    );
    drop(m);
    assert!(hold.valid_until() <= cap);
}

/// A write lock's downgrade round on `keys`, started at `start`, for a lock valid until
/// `valid_until`.
fn downgrade_round<'a>(
    hold: &'a mut Hold,
    keys: &'a RwKeys,
    config: &'a Config,
    token: Token,
    start: Instant,
) -> HoldRound<'a> {
    let spec = Spec {
        keys: Keys::Write {
            resource: b"doc",
            keys,
        },
        fence: None,
    };
    let timing = Timing {
        ttl: 300 * MS,
        drift_factor: 0.01,
    };
    let step = Step::Downgrade {
        ttl_ms: 300,
        timing,
    };
    let round = Round::new(config.nodes.len(), start, None, None);
    hold.round(spec, token, config, step, start, round)
}

#[test]
fn a_won_downgrade_gives_the_read_lock_its_validity_from_the_round_start() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([10; 32]));
    let keys = RwKeys::new(b"doc");
    let token = Token::from_random([3; 20]);
    let mut hold = Hold::new(t0 + 9_000 * MS);
    let start = t0 + 10 * MS;
    let mut m = downgrade_round(&mut hold, &keys, &config, token, start);
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "one transmit: {out:?}");
    let d = &out[0];
    assert_eq!((d.to, d.name()), (To::All, &b"EVALSHA"[..]));
    assert!(matches!(d.what, What::Downgrade { ttl_ms: 300, .. }));
    // EVALSHA sha 2 writer readers token ttl wake
    assert_eq!(d.args[3], keys.writer());
    assert_eq!(d.args[4], keys.readers());
    assert_eq!(d.args[5], token.as_bytes());
    assert_eq!(d.args[6], b"300");
    let tag = d.tag.unwrap();
    m.handle_reply(1, tag, &Reply::Integer(1), start + MS, &mut rng);
    m.handle_reply(0, tag, &Reply::Integer(0), start + MS, &mut rng);
    assert!(m.poll_outcome().is_none());
    m.handle_reply(2, tag, &Reply::Integer(1), start + 2 * MS, &mut rng);
    m.poll_outcome().expect("done").expect("won");
    assert!(sent(&mut m).is_empty(), "nothing to undo");
    drop(m);
    let timing = Timing {
        ttl: 300 * MS,
        drift_factor: 0.01,
    };
    // Within the usual bounds: at most ttl − drift from the round's start, less the round.
    let bound = timing.valid_until(start).unwrap();
    assert!(hold.valid_until() <= bound && hold.valid_until() > start);
    assert!(
        hold.valid_until() < t0 + 9_000 * MS,
        "the write lock's is gone"
    );
}

#[test]
fn a_lost_downgrade_is_undone_on_every_node_and_leaves_nothing_held() {
    let config = config(5, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([11; 32]));
    let keys = RwKeys::new(b"doc");
    let token = Token::from_random([4; 20]);
    for yes in 0..=5usize {
        let mut hold = Hold::new(t0 + 9_000 * MS);
        let start = t0 + 10 * MS;
        let mut m = downgrade_round(&mut hold, &keys, &config, token, start);
        let tag = sent(&mut m)[0].tag.unwrap();
        // `yes` nodes downgrade, two refuse (the writer key expired there), the rest fail.
        for node in 0..5 {
            let now = start + MS;
            if node < yes {
                m.handle_reply(node, tag, &Reply::Integer(1), now, &mut rng);
            } else if node < yes + 2 {
                m.handle_reply(node, tag, &Reply::Integer(0), now, &mut rng);
            } else {
                m.handle_failure(node, tag, NodeErrorKind::Timeout, now, &mut rng);
            }
        }
        let out = sent(&mut m);
        let result = m.poll_outcome().expect("every node answered");
        if yes >= 3 {
            assert!(result.is_ok(), "{yes} of 5: {result:?}");
            assert!(out.is_empty());
            continue;
        }
        let error = result.expect_err("no quorum");
        if yes + 2 >= 5 - 2 {
            // Refusals outnumber what a quorum could still use: contention (the lock is lost).
            assert!(
                matches!(
                    error,
                    Error::Contended { .. } | Error::QuorumUnreachable { .. }
                ),
                "{error:?}"
            );
        }
        assert_eq!(out.len(), 1, "{yes} of 5: the undo only: {out:?}");
        let undo = &out[0];
        assert_eq!((undo.to, undo.tag), (To::All, None));
        assert_eq!((undo.form, undo.name()), (ScriptForm::Body, &b"EVAL"[..]));
        assert!(matches!(undo.what, What::DowngradeUndo { .. }));
        assert_eq!(
            &undo.args[3..],
            [
                keys.writer().to_vec(),
                keys.readers().to_vec(),
                token.as_bytes().to_vec(),
                b"redlock-mux:wake:doc".to_vec(),
            ]
        );
        drop(m);
        assert!(hold.validity(start) == Duration::ZERO, "nothing is held");
    }

    // Asked for after the write lock's validity ended: no downgrade goes out, only the undo.
    let mut hold = Hold::new(t0 + 5 * MS);
    let mut m = downgrade_round(&mut hold, &keys, &config, token, t0 + 10 * MS);
    let out = sent(&mut m);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(out[0].what, What::DowngradeUndo { .. }));
    let error = m.poll_outcome().expect("done").expect_err("expired");
    assert_eq!(error.deadline(), Some(Deadline::Validity));
}

#[test]
fn a_downgraded_read_lock_extends_as_a_reader_and_its_release_removes_both_entries() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([12; 32]));
    let keys = RwKeys::new(b"doc");
    let token = Token::from_random([5; 20]);
    let spec = Spec {
        keys: Keys::Downgraded {
            resource: b"doc",
            keys: &keys,
        },
        fence: None,
    };
    let mut hold = Hold::new(t0 + 9_000 * MS);
    let step = Step::Extend {
        ttl_ms: 300,
        timing: Timing {
            ttl: 300 * MS,
            drift_factor: 0.01,
        },
    };
    let round = Round::new(3, t0, None, None);
    let mut m = hold.round(spec, token, &config, step, t0, round);
    let ext = sent(&mut m).remove(0);
    assert_eq!(ext.args[3], keys.readers(), "a reader's extend: {ext:?}");
    for node in 0..3 {
        m.handle_reply(node, ext.tag.unwrap(), &Reply::Integer(1), t0, &mut rng);
    }
    m.poll_outcome().expect("done").expect("won");
    drop(m);
    let round = Round::new(3, t0, None, None);
    let mut m = hold.round(spec, token, &config, Step::Release, t0, round);
    let rel = sent(&mut m).remove(0);
    // The undo's script: the reader entry, and a writer key a node may still hold.
    assert_eq!(
        &rel.args[3..5],
        [keys.writer().to_vec(), keys.readers().to_vec()]
    );
    assert_eq!(
        rel.args[1],
        crate::engine::rw::DOWNGRADE_UNDO.sha.to_vec(),
        "{rel:?}"
    );
    for node in 0..2 {
        m.handle_reply(node, rel.tag.unwrap(), &Reply::Integer(0), t0, &mut rng);
    }
    m.poll_outcome().expect("done").expect("acknowledged");
}

/// A fair waiter on five nodes (quorum 3), subscribed, whose second attempt (tagged as
/// returned) is out: `spec`'s first attempt was refused without queueing.
fn fair_second_attempt<'a>(
    spec: Spec<'a>,
    config: &'a Config,
    rng: &mut Jitter,
    t0: Instant,
) -> (Acquisition<'a>, Tag) {
    let p = Params {
        fair: true,
        ticket: 1,
        ..params(true)
    };
    let round = Round::new(5, t0, None, None);
    let mut m = Acquisition::new(spec, config, p, t0, round, rng);
    let first = sent(&mut m).remove(0);
    let refused = if spec.fence.is_some() { -1 } else { 0 };
    for node in 0..5 {
        m.handle_reply(node, first.tag.unwrap(), &Reply::Integer(refused), t0, rng);
    }
    let _ = sent(&mut m);
    m.handle_subscribed(t0, rng);
    let second = sent(&mut m).remove(0);
    assert_eq!(second.name(), b"EVALSHA");
    (m, second.tag.unwrap())
}

/// A fair refusal at `rank` as `spec`'s script answers it.
fn queued_at(spec: Spec<'_>, rank: i64) -> Reply<'static> {
    if spec.fence.is_some() {
        Reply::Integer(-1 - rank)
    } else {
        Reply::Integer(2 + rank)
    }
}

const WAKE_K: &[u8] = b"redlock-mux:wake:k";

#[test]
fn a_fair_waiter_lets_as_many_releases_pass_as_its_rank_on_a_quorum() {
    let fence = fence_key(b"k");
    for fenced in [false, true] {
        let spec = Spec {
            keys: Keys::Mutex(b"k"),
            fence: fenced.then_some(&fence[..]),
        };
        let config = config(5, 5);
        let (t0, mut rng) = (Instant::now(), Jitter::from_seed([9; 32]));
        let (mut m, tag) = fair_second_attempt(spec, &config, &mut rng, t0);
        // Ranks 2, 2, 3, 5 and 1: it is third or better on three nodes.
        for (node, rank) in [2, 2, 3, 5, 1].into_iter().enumerate() {
            m.handle_reply(node, tag, &queued_at(spec, rank), t0 + MS, &mut rng);
        }
        assert!(m.poll_outcome().is_none());
        assert_eq!(sent(&mut m).len(), 1, "the cleanup");
        let now = t0 + 2 * MS;
        // The first release, announced by every node, counts once: no retry.
        for node in 0..5 {
            m.handle_wake(node, WAKE_K, b"aaaaaaaaaaaaaaaa", now, &mut rng);
        }
        assert!(sent(&mut m).is_empty(), "fenced {fenced}");
        // The second: now it may be the head.
        m.handle_wake(1, WAKE_K, b"bbbbbbbbbbbbbbbb", now + MS, &mut rng);
        let third = sent(&mut m);
        assert_eq!(third.len(), 1, "{third:?}");
        assert_eq!(third[0].name(), b"EVALSHA");
        // At the head (2, or -1 when fenced) it retries at the next release.
        let tag = third[0].tag.unwrap();
        for node in 0..5 {
            m.handle_reply(node, tag, &queued_at(spec, 0), now + MS, &mut rng);
        }
        let _ = sent(&mut m);
        m.handle_wake(0, WAKE_K, b"cccccccccccccccc", now + 2 * MS, &mut rng);
        assert_eq!(sent(&mut m).len(), 1, "the head retries at once");
    }
}

#[test]
fn a_late_reply_lowers_the_rank_and_an_unknown_rank_retries_at_every_release() {
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let config = config(5, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([10; 32]));
    let (mut m, tag) = fair_second_attempt(spec, &config, &mut rng, t0);
    // Three refusals decide the round: rank 5 on a quorum.
    for (node, rank) in [(0, 5), (1, 1), (2, 1)] {
        m.handle_reply(node, tag, &queued_at(spec, rank), t0 + MS, &mut rng);
    }
    let _ = sent(&mut m);
    // One release: 4 to go, it keeps waiting.
    m.handle_wake(1, WAKE_K, b"aaaaaaaaaaaaaaaa", t0 + 2 * MS, &mut rng);
    assert!(sent(&mut m).is_empty());
    // A node that answers after the decision says rank 1: now 1 on a quorum, and that
    // release was it: it retries at once.
    m.handle_reply(3, tag, &queued_at(spec, 1), t0 + 3 * MS, &mut rng);
    let third = sent(&mut m);
    assert_eq!(third.len(), 1, "{third:?}");
    assert_eq!(third[0].name(), b"EVALSHA");

    // Ranks from too few nodes (the others failed): it retries at the first release.
    let tag = third[0].tag.unwrap();
    let now = t0 + 4 * MS;
    m.handle_reply(0, tag, &queued_at(spec, 6), now, &mut rng);
    m.handle_reply(1, tag, &queued_at(spec, 6), now, &mut rng);
    for node in 2..5 {
        m.handle_failure(node, tag, NodeErrorKind::Timeout, now, &mut rng);
    }
    assert!(m.poll_outcome().is_none());
    let _ = sent(&mut m);
    m.handle_wake(0, WAKE_K, b"bbbbbbbbbbbbbbbb", now + MS, &mut rng);
    assert_eq!(sent(&mut m).len(), 1);
}

#[test]
fn a_fair_waiter_behind_others_retries_at_the_backstop_and_counts_it_only_without_releases() {
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let config = config(5, 1);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([11; 32]));
    let (mut m, tag) = fair_second_attempt(spec, &config, &mut rng, t0);
    for node in 0..5 {
        m.handle_reply(node, tag, &queued_at(spec, 3), t0, &mut rng);
    }
    let _ = sent(&mut m);
    // One release of the three ahead: it keeps waiting...
    m.handle_wake(0, WAKE_K, b"aaaaaaaaaaaaaaaa", t0 + MS, &mut rng);
    assert!(sent(&mut m).is_empty());
    // ...until its backstop (the other releases were never announced), which does not count:
    // the queue was moving.
    let backstop = m.poll_timeout().expect("a backstop");
    m.handle_timeout(backstop, &mut rng);
    let third = sent(&mut m).remove(0);
    for node in 0..5 {
        m.handle_reply(
            node,
            third.tag.unwrap(),
            &queued_at(spec, 1),
            backstop,
            &mut rng,
        );
    }
    assert!(m.poll_outcome().is_none(), "the retry count is not spent");
    let _ = sent(&mut m);
    // No release at all before the next backstop: that retry counts, and ends the wait.
    let backstop = m.poll_timeout().expect("a backstop");
    m.handle_timeout(backstop, &mut rng);
    let fourth = sent(&mut m).remove(0);
    for node in 0..5 {
        m.handle_reply(
            node,
            fourth.tag.unwrap(),
            &queued_at(spec, 1),
            backstop,
            &mut rng,
        );
    }
    let error = m.poll_outcome().expect("done").expect_err("lost");
    assert_eq!(error.deadline(), Some(Deadline::RetryCount), "{error:?}");
    // It leaves the queue.
    let names: Vec<Vec<u8>> = sent(&mut m)
        .into_iter()
        .map(|s| s.args[0].clone())
        .collect();
    assert_eq!(
        names,
        [&b"EVAL"[..], b"EVAL", b"UNSUBSCRIBE"],
        "cleanup, leave, then"
    );
}

#[test]
fn a_fair_waiter_cancelled_while_it_counts_releases_leaves_the_queue() {
    let spec = Spec {
        keys: Keys::Mutex(b"k"),
        fence: None,
    };
    let config = config(5, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([12; 32]));
    let (mut m, tag) = fair_second_attempt(spec, &config, &mut rng, t0);
    for node in 0..5 {
        m.handle_reply(node, tag, &queued_at(spec, 4), t0, &mut rng);
    }
    let _ = sent(&mut m);
    m.handle_wake(0, WAKE_K, b"aaaaaaaaaaaaaaaa", t0 + MS, &mut rng);
    assert!(sent(&mut m).is_empty());
    m.handle_cancel(t0 + 2 * MS, &mut rng);
    assert!(matches!(m.poll_outcome(), Some(Err(Error::Cancelled))));
    let out = sent(&mut m);
    assert!(
        out.iter().any(|s| matches!(s.what, What::Leave { .. })),
        "{out:?}"
    );
    assert_eq!(m.poll_timeout(), None);
}

/// A lost attempt's cleanup is still sent when the next attempt starts at once (a release
/// was announced meanwhile) and is lost at once too, while being sent (no node can take it:
/// their connections just broke). Seen against real servers closing connections every 150 ms:
/// the second loss replaced the first cleanup before it went out, and the first attempt's key
/// stayed on the node that had run it.
#[test]
fn a_cleanup_is_not_replaced_by_the_next_attempt_s_when_that_one_is_lost_while_sent() {
    let config = config(3, 5);
    let (t0, mut rng) = (Instant::now(), Jitter::from_seed([9; 32]));
    let (mut m, _) = waiting(&config, &mut rng, t0);
    let now = t0 + MS;
    // Someone's release: the third attempt goes out at once.
    m.handle_wake(0, b"redlock-mux:wake:k", b"0123456789abcdef", now, &mut rng);
    let third = sent(&mut m).remove(0);
    let (tag3, token3) = (third.tag.unwrap(), token_of(third.what));
    // Node 0's connection breaks (it may have run the attempt), another release is announced
    // there, then the other two connections break: the attempt is lost, and the fourth starts
    // at once.
    let reset = || NodeErrorKind::Io(std::io::ErrorKind::ConnectionReset);
    m.handle_failure(0, tag3, reset(), now, &mut rng);
    m.handle_wake(0, b"redlock-mux:wake:k", b"fedcba9876543210", now, &mut rng);
    m.handle_failure(1, tag3, reset(), now, &mut rng);
    m.handle_failure(2, tag3, reset(), now, &mut rng);
    // As a driver does: a node that cannot be sent a tagged transmit fails it at once.
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit() {
        if let (Some(tag), What::Acquire { .. }) = (t.tag, t.what) {
            for node in 0..3 {
                m.handle_failure(node, tag, reset(), now, &mut rng);
            }
        }
        out.push(encoded(&m, &t));
    }
    let cleaned: Vec<Token> = out
        .iter()
        .filter(|s| matches!(s.what, What::Cleanup { .. }))
        .map(|s| token_of(s.what))
        .collect();
    let whats: Vec<What> = out.iter().map(|s| s.what).collect();
    assert!(
        cleaned.contains(&token3),
        "the third attempt is never undone: {whats:?}"
    );
}
