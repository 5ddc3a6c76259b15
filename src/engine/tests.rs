//! The quorum core under virtual time: simulated nodes are just the votes and the instants at
//! which they arrive.

use std::time::{Duration, Instant};

use super::*;
use crate::error::NodeErrorKind;

const MS: Duration = Duration::from_millis(1);

fn timing(ttl_ms: u64) -> Timing {
    Timing {
        ttl: Duration::from_millis(ttl_ms),
        drift_factor: 0.01,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Node {
    Yes,
    No,
    Fail,
    Silent,
}

const KINDS: [Node; 4] = [Node::Yes, Node::No, Node::Fail, Node::Silent];

fn vote(n: Node) -> Option<Vote> {
    match n {
        Node::Yes => Some(Vote::Yes),
        Node::No => Some(Vote::No),
        Node::Fail => Some(Vote::Failed(NodeErrorKind::Io(
            std::io::ErrorKind::ConnectionReset,
        ))),
        Node::Silent => None,
    }
}

/// What the decision must be, and at which step (index of the arrival, or `None` for the
/// timeout), from first principles rather than from the code under test.
fn expected(pattern: &[Node]) -> (Decision, Option<usize>, usize) {
    let n = pattern.len();
    let q = n / 2 + 1;
    let (mut yes, mut no, mut failed) = (0, 0, 0);
    let judge = |yes: usize, no: usize, failed: usize| {
        if yes >= q {
            Some("won")
        } else if failed > n - q {
            Some("unreachable")
        } else if no + failed > n - q {
            Some("contended")
        } else {
            None
        }
    };
    for (i, p) in pattern.iter().enumerate() {
        match p {
            Node::Yes => yes += 1,
            Node::No => no += 1,
            Node::Fail => failed += 1,
            Node::Silent => continue,
        }
        if let Some(d) = judge(yes, no, failed) {
            return (to_decision(d), Some(i), no);
        }
    }
    // The silent nodes fail at their node timeout, one after the other, in the order the
    // endpoint tells them (node order).
    for _ in pattern.iter().filter(|p| **p == Node::Silent) {
        failed += 1;
        if let Some(d) = judge(yes, no, failed) {
            return (to_decision(d), None, no);
        }
    }
    unreachable!("every node counted")
}

fn to_decision(d: &str) -> Decision {
    let t = Instant::now();
    match d {
        "won" => Decision::Won {
            valid_until: Some(t),
            at: t,
        },
        "unreachable" => Decision::Unreachable,
        _ => Decision::Contended,
    }
}

fn same_kind(a: &Decision, b: &Decision) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

#[test]
fn every_pattern_of_outcomes_for_one_to_five_nodes() {
    let t0 = Instant::now();
    let node_timeout = 50 * MS;
    let mut checked = 0;
    for n in 1..=5usize {
        for code in 0..4usize.pow(n as u32) {
            let pattern: Vec<Node> = (0..n).map(|i| KINDS[(code >> (2 * i)) & 3]).collect();
            let (want, step, refused) = expected(&pattern);
            let mut round = Round::new(n, t0, Some(timing(10_000)), None);
            let mut decided_at_step = None;
            // (votes so far, votes_to_decide then), while undecided.
            let mut hints = Vec::new();
            let mut votes = 0;
            for (i, p) in pattern.iter().enumerate() {
                let Some(v) = vote(*p) else { continue };
                if round.decision().is_none() {
                    hints.push((votes, round.votes_to_decide()));
                }
                let now = t0 + MS * (i as u32 + 1);
                round.handle_vote(i, v, now);
                votes += 1;
                if decided_at_step.is_none() && round.decision().is_some() {
                    // A driver that holds replies back until `votes_to_decide` have come
                    // never holds back the one that decides.
                    for &(before, hint) in &hints {
                        assert!(
                            votes - before >= hint,
                            "{pattern:?}: decided {} votes after a hint of {hint}",
                            votes - before
                        );
                    }
                    decided_at_step = Some(i);
                    if let Some(Decision::Won { valid_until, at }) = round.decision() {
                        assert_eq!(at, now);
                        assert_eq!(valid_until, timing(10_000).valid_until(t0));
                    }
                }
            }
            if round.decision().is_none() {
                // The round waits for the silent nodes until its validity; their failures come
                // from the endpoint, once their node timeout has passed.
                assert!(round.poll_timeout().is_some_and(|t| t > t0 + node_timeout));
                round.handle_timeout(t0 + node_timeout);
                assert!(
                    round.decision().is_none(),
                    "{pattern:?} decided before the timeouts"
                );
                for (i, p) in pattern.iter().enumerate() {
                    if vote(*p).is_none() {
                        let timeout = Vote::Failed(NodeErrorKind::Timeout);
                        round.handle_vote(i, timeout, t0 + node_timeout);
                    }
                }
            }
            let got = round.decision().expect("decided after the timeout");
            assert!(
                same_kind(&got, &want),
                "{pattern:?}: {got:?}, want {want:?}"
            );
            assert_eq!(
                decided_at_step, step,
                "{pattern:?}: decided at the wrong moment"
            );
            assert_eq!(round.poll_timeout(), None);
            if got == Decision::Contended {
                // Late votes are recorded too, so every refusal is counted in the end.
                assert!(round.refused() >= refused);
                let all_no = pattern.iter().filter(|p| **p == Node::No).count();
                assert_eq!(round.refused(), all_no);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 4 + 16 + 64 + 256 + 1024);
}

#[test]
fn returns_on_quorum_without_waiting_for_stragglers() {
    let t0 = Instant::now();
    let mut round = Round::new(5, t0, Some(timing(1000)), None);
    round.handle_vote(4, Vote::Yes, t0 + MS);
    round.handle_vote(0, Vote::Yes, t0 + 2 * MS);
    assert_eq!(round.decision(), None);
    round.handle_vote(2, Vote::Yes, t0 + 3 * MS);
    let d = round.decision().unwrap();
    assert!(matches!(d, Decision::Won { at, .. } if at == t0 + 3 * MS));
    // Nodes 1 and 3 are still pending: their later replies are recorded but change nothing.
    assert!(round.is_pending(1) && round.is_pending(3));
    round.handle_vote(1, Vote::No, t0 + 40 * MS);
    round.handle_timeout(t0 + 60 * MS);
    assert_eq!(round.decision(), Some(d));
    assert_eq!(round.votes()[1], Some(Vote::No));
}

#[test]
fn votes_to_decide_counts_the_nearer_of_a_win_and_a_loss() {
    let t0 = Instant::now();
    let mut round = Round::new(5, t0, Some(timing(1000)), None);
    assert_eq!(round.votes_to_decide(), 3);
    round.handle_vote(0, Vote::Yes, t0 + MS);
    assert_eq!(round.votes_to_decide(), 2);
    round.handle_vote(1, Vote::No, t0 + MS);
    round.handle_vote(2, Vote::Failed(NodeErrorKind::Timeout), t0 + MS);
    // Two grants to win, one refusal or failure to lose.
    assert_eq!(round.votes_to_decide(), 1);
    round.handle_vote(3, Vote::No, t0 + MS);
    assert_eq!(round.decision(), Some(Decision::Contended));
    assert_eq!(round.votes_to_decide(), 1);
}

#[test]
fn fails_as_soon_as_quorum_is_impossible() {
    let t0 = Instant::now();
    let mut round = Round::new(5, t0, Some(timing(1000)), None);
    round.handle_vote(0, Vote::No, t0 + MS);
    round.handle_vote(1, Vote::Failed(NodeErrorKind::Timeout), t0 + MS);
    assert_eq!(round.decision(), None);
    round.handle_vote(2, Vote::No, t0 + 2 * MS);
    assert_eq!(round.decision(), Some(Decision::Contended));
    assert_eq!(round.refused(), 2);
    assert_eq!(round.failures().map(|(i, _)| i).collect::<Vec<_>>(), [1]);
}

#[test]
fn validity_is_ttl_minus_elapsed_minus_drift() {
    let t = timing(10_000);
    assert_eq!(t.drift(), 100 * MS + 2 * MS);
    assert_eq!(
        t.validity(30 * MS),
        Some(Duration::from_millis(10_000 - 30 - 102))
    );
    assert_eq!(t.validity(Duration::from_millis(9_898)), None);
    assert_eq!(t.validity(Duration::from_secs(20)), None);
}

#[test]
fn quorum_after_the_validity_is_expired() {
    let t0 = Instant::now();
    // TTL 10 ms: drift is 2.1 ms, so the lock is valid for 7.9 ms after the start at most.
    let t = timing(10);
    let mut round = Round::new(3, t0, Some(t), None);
    assert_eq!(round.poll_timeout(), t.valid_until(t0));
    round.handle_vote(0, Vote::Yes, t0 + MS);
    round.handle_vote(1, Vote::Yes, t0 + 8 * MS);
    assert_eq!(
        round.decision(),
        Some(Decision::Expired { elapsed: 8 * MS })
    );
}

#[test]
fn expires_on_its_own_when_validity_runs_out_before_any_quorum() {
    let t0 = Instant::now();
    let t = timing(20);
    let mut round = Round::new(3, t0, Some(t), None);
    let deadline = round.poll_timeout().unwrap();
    assert!(deadline < t0 + 20 * MS);
    round.handle_timeout(deadline);
    assert!(matches!(round.decision(), Some(Decision::Expired { .. })));
}

#[test]
fn ttl_within_drift_is_lost_immediately() {
    let t0 = Instant::now();
    let mut round = Round::new(3, t0, Some(timing(2)), None);
    assert!(matches!(round.decision(), Some(Decision::Expired { .. })));
    round.handle_vote(0, Vote::Yes, t0);
    assert!(matches!(round.decision(), Some(Decision::Expired { .. })));
}

#[test]
fn extend_must_finish_within_the_current_validity() {
    let t0 = Instant::now();
    let hold = t0 + 5 * MS;
    let mut round = Round::new(3, t0, Some(timing(10_000)), Some(hold));
    assert_eq!(round.poll_timeout(), Some(hold));
    round.handle_vote(0, Vote::Yes, t0 + MS);
    round.handle_vote(1, Vote::Yes, t0 + 6 * MS);
    assert!(matches!(round.decision(), Some(Decision::Expired { .. })));

    let mut round = Round::new(3, t0, Some(timing(10_000)), Some(hold));
    round.handle_vote(0, Vote::Yes, t0 + MS);
    round.handle_vote(1, Vote::Yes, t0 + 2 * MS);
    // The new validity counts from the start of the extend round.
    assert_eq!(
        round.decision(),
        Some(Decision::Won {
            valid_until: timing(10_000).valid_until(t0),
            at: t0 + 2 * MS
        })
    );
}

#[test]
fn acknowledgement_rounds_have_no_validity() {
    let t0 = Instant::now();
    let mut round = Round::new(3, t0, None, None);
    // Nothing to wait for but the nodes (their timeouts are the endpoint's).
    assert_eq!(round.poll_timeout(), None);
    round.handle_vote(2, Vote::Yes, t0 + MS);
    round.handle_vote(0, Vote::Yes, t0 + 2 * MS);
    assert_eq!(
        round.decision(),
        Some(Decision::Won {
            valid_until: None,
            at: t0 + 2 * MS
        })
    );
}

#[test]
fn duplicate_and_out_of_range_votes_are_ignored() {
    let t0 = Instant::now();
    let mut round = Round::new(3, t0, Some(timing(1000)), None);
    round.handle_vote(0, Vote::Yes, t0);
    round.handle_vote(0, Vote::Yes, t0);
    round.handle_vote(7, Vote::Yes, t0);
    assert_eq!(round.decision(), None);
    round.handle_vote(0, Vote::No, t0);
    assert_eq!(round.votes()[0], Some(Vote::Yes));
}

#[test]
fn reset_reuses_a_round() {
    let t0 = Instant::now();
    let mut round = Round::new(3, t0, Some(timing(1000)), None);
    round.handle_vote(0, Vote::No, t0);
    round.handle_vote(1, Vote::No, t0);
    assert_eq!(round.decision(), Some(Decision::Contended));
    let t1 = t0 + 100 * MS;
    round.reset(t1, Some(timing(1000)), None);
    assert_eq!(round.decision(), None);
    assert!(round.votes().iter().all(Option::is_none));
    assert_eq!(round.start(), t1);
}

#[test]
fn key_names_are_documented_and_share_the_slot() {
    let plain = KeyNames::new(b"invoice:42");
    assert_eq!(plain.mutex, b"invoice:42");
    assert_eq!(plain.mutex_queue, b"{invoice:42}:q");
    assert_eq!(plain.mutex_queue_expiries, b"{invoice:42}:qx");
    assert_eq!(plain.writer, b"{rw:invoice:42}:w");
    assert_eq!(plain.readers, b"{rw:invoice:42}:r");
    assert_eq!(plain.intents, b"{rw:invoice:42}:wi");
    assert_eq!(plain.rw_queue, b"{rw:invoice:42}:q");
    assert_eq!(plain.rw_queue_expiries, b"{rw:invoice:42}:qx");
    let tagged = KeyNames::new(b"user:{42}");
    assert_eq!(tagged.mutex_queue, b"user:{42}:fq");
    assert_eq!(tagged.writer, b"user:{42}:rw:w");
    assert_eq!(tagged.rw_queue_expiries, b"user:{42}:rw:qx");
    // An empty tag is no tag.
    assert_eq!(KeyNames::new(b"a{}b").mutex_queue, b"{a{}b}:q");
}
