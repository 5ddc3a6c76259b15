//! Drives the quorum core with arbitrary votes, node indices (out of range and repeated ones
//! included), timeouts, instants that go backwards, and arbitrary reply bytes read by the real
//! lock ops. The round must never panic, never change a decision once made, win only with a
//! quorum of yes votes, and have a deadline only while it is undecided, and then exactly when
//! it has a validity to be won within (a node's timeout is a failure vote, from outside).
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use redlock_mux::internals::{quorum, Decision, Round, Timing, Vote};
use redlock_mux::internals::{Acquire, Extend, Op, Release, Verdict};
use redlock_mux::resp::{decode, Limits, Status};
use redlock_mux::NodeErrorKind;

fn check(
    round: &Round,
    before: Option<Decision>,
    yes_when_decided: &mut Option<usize>,
    bounded: bool,
) {
    let d = round.decision();
    if let Some(b) = before {
        assert_eq!(d, Some(b), "a decision changed");
    }
    assert_eq!(round.poll_timeout().is_some(), d.is_none() && bounded);
    let yes = round
        .votes()
        .iter()
        .filter(|v| **v == Some(Vote::Yes))
        .count();
    let pending = round.votes().iter().filter(|v| v.is_none()).count();
    if before.is_none() {
        match d {
            Some(Decision::Won { .. }) => assert!(yes >= round.quorum(), "won without quorum"),
            Some(Decision::Contended | Decision::Unreachable) => {
                assert!(
                    yes + pending < round.quorum(),
                    "gave up while a quorum was possible"
                )
            }
            _ => {}
        }
        if d.is_some() {
            *yes_when_decided = Some(yes);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // The fifth byte was the node timeout, which rounds no longer keep: it is skipped, so
    // that the committed corpus keeps its meaning.
    let [n, mode, ttl_hi, ttl_lo, _, rest @ ..] = data else {
        return;
    };
    let nodes = 1 + *n as usize % 9;
    let base = Instant::now();
    let ttl_ms = u16::from_be_bytes([*ttl_hi, *ttl_lo]) as u64;
    let timing = (mode & 1 == 1).then_some(Timing {
        ttl: Duration::from_millis(ttl_ms),
        drift_factor: (mode >> 4) as f64 / 40.0,
    });
    let hold = (mode & 2 == 2).then(|| base + Duration::from_millis(ttl_ms / 2));
    let bounded = timing.is_some() || hold.is_some();
    let mut round = Round::new(nodes, base, timing, hold);
    assert_eq!(round.quorum(), quorum(nodes));
    let mut decided_yes = None;
    check(&round, None, &mut decided_yes, bounded);
    let (key, token) = (&b"k"[..], &b"t"[..]);
    let ops: [&dyn Op; 3] = [
        &Acquire { key, token, ttl_ms },
        &Release { key, token },
        &Extend { key, token, ttl_ms },
    ];
    let mut now_ms: u64 = 0;
    let mut rest = rest;
    while let [kind, node, dt, tail @ ..] = rest {
        rest = tail;
        // Time moves by -64..=63 ms a step: backwards too.
        now_ms = now_ms.saturating_add_signed(*dt as i8 as i64 / 2);
        let now = base + Duration::from_millis(now_ms);
        let node = *node as usize % (nodes + 3);
        let before = round.decision();
        match kind % 5 {
            0 => round.handle_vote(node, Vote::Yes, now),
            1 => round.handle_vote(node, Vote::No, now),
            2 => round.handle_vote(node, Vote::Failed(NodeErrorKind::Timeout), now),
            3 => round.handle_timeout(now),
            _ => {
                let len = (*kind as usize / 5).min(rest.len());
                let (reply, tail) = rest.split_at(len);
                rest = tail;
                if let Ok(Status::Complete((reply, _))) = decode(reply, &Limits::default()) {
                    if let Verdict::Vote(v) = ops[node % 3].classify(&reply) {
                        round.handle_vote(node, v, now);
                    }
                }
            }
        }
        check(&round, before, &mut decided_yes, bounded);
        if let Some(deadline) = round.poll_timeout() {
            if deadline <= now {
                let before = round.decision();
                round.handle_timeout(now);
                check(&round, before, &mut decided_yes, bounded);
            }
        }
    }
});
