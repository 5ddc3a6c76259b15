//! CPU cost of the sans-IO core per operation: a quorum round at N = 5 fed its votes under
//! virtual time, and encoding the lock commands. No sockets, no clock reads inside the timed
//! work except the one `Instant` taken per round, as the driver does.
//!
//! `cargo bench --bench core`

mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use redlock_mux::internals::{Acquire, Op, Release, ScriptForm};
use redlock_mux::internals::{Decision, Round, Timing, Vote};
use redlock_mux::resp::Reply;
use redlock_mux::NodeErrorKind;
use support::{bench, header};

const N: usize = 5;
const KEY: &[u8] = b"invoice:4242";
const TOKEN: &[u8] = b"3f8a2c1e9b7d4f6a0c5e8b2d1f3a7c9e4b6d8f0a";
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const US: Duration = Duration::from_micros(1);

fn main() {
    let timing = Timing {
        ttl: Duration::from_secs(10),
        drift_factor: 0.01,
    };
    let mut round = Round::new(N, Instant::now(), Some(timing), None);

    header("Quorum core, N = 5 (virtual time)");
    bench("acquire round: 5 yes votes, decided", 0, || {
        let start = Instant::now();
        round.reset(start, Some(timing), None);
        for node in 0..N {
            round.handle_vote(node, Vote::Yes, start + US * (node as u32 + 1));
        }
        assert!(matches!(round.decision(), Some(Decision::Won { .. })));
        black_box(round.poll_timeout());
    });
    bench("contended round: 2 yes, 3 no", 0, || {
        let start = Instant::now();
        round.reset(start, Some(timing), None);
        for node in 0..N {
            let vote = if node < 2 { Vote::Yes } else { Vote::No };
            round.handle_vote(node, vote, start + US * (node as u32 + 1));
        }
        assert_eq!(round.decision(), Some(Decision::Contended));
    });
    bench("release round: 3 acks, 2 nodes time out", 0, || {
        let start = Instant::now();
        round.reset(start, None, None);
        for node in 0..3 {
            round.handle_vote(node, Vote::Yes, start + US);
        }
        for node in 3..5 {
            let timeout = Vote::Failed(NodeErrorKind::Timeout);
            round.handle_vote(node, timeout, start + NODE_TIMEOUT);
        }
        black_box(round.decision());
    });

    header("Lock commands (Op::encode, Op::classify)");
    let mut out = Vec::with_capacity(512);
    let acquire = Acquire {
        key: KEY,
        token: TOKEN,
        ttl_ms: 10_000,
    };
    let release = Release {
        key: KEY,
        token: TOKEN,
    };
    out.clear();
    acquire.encode(&mut out, ScriptForm::Sha);
    let acquire_len = out.len();
    bench("Acquire::encode (SET NX PX)", acquire_len, || {
        out.clear();
        black_box(&acquire).encode(&mut out, ScriptForm::Sha);
        black_box(&out);
    });
    out.clear();
    release.encode(&mut out, ScriptForm::Sha);
    let release_len = out.len();
    bench("Release::encode (EVALSHA)", release_len, || {
        out.clear();
        black_box(&release).encode(&mut out, ScriptForm::Sha);
        black_box(&out);
    });
    bench("Acquire::encode to 5 nodes", acquire_len * N, || {
        out.clear();
        for _ in 0..N {
            black_box(&acquire).encode(&mut out, ScriptForm::Sha);
        }
        black_box(&out);
    });
    bench("Acquire::classify(+OK)", 0, || {
        black_box(black_box(&acquire).classify(black_box(&Reply::Simple(b"OK"))));
    });
}
