//! `redlock-mux inspect`: what each node holds for a key, and what that means for the quorum.
#![forbid(unsafe_code)]

use std::time::Duration;

use redlock_mux::resp::Value;

use crate::args::{self, Spec};
use crate::node::NodeConn;
use crate::Fail;

const HELP: &str = "\
Usage: redlock-mux inspect KEY [--nodes URLS] [--timeout 1s]

Shows, for each node, whether it is reachable, the prefix of the holder's token
and its PTTL, and ends with a summary over the quorum. Read-write and fair
locks (readers, queue length) are not supported yet: such keys are shown by
type only.

Options:
  --nodes URLS   comma-separated redis:// URLs (default: $REDLOCK_NODES)
  --timeout D    connect and read timeout per node (default 1s)
  -h, --help     this text
";

/// Characters of a token shown: enough to tell holders apart, not enough to forge a release.
const TOKEN_PREFIX: usize = 12;

/// What one node holds for the key.
enum State {
    Unreachable(String),
    Free,
    Held {
        token: Vec<u8>,
        pttl_ms: i64,
    },
    /// A key of another type, e.g. a read-write or fair lock's structure.
    Other {
        kind: String,
        pttl_ms: i64,
    },
}

/// Entry point of `redlock-mux inspect`.
pub fn main(argv: &[String]) -> Result<i32, Fail> {
    let spec = Spec {
        options: &["nodes", "timeout"],
        switches: &[],
        takes_command: false,
    };
    let Some(parsed) = args::parse_command(&spec, argv, HELP)? else {
        return Ok(0);
    };
    let key = parsed.key()?;
    let nodes = args::nodes(&parsed)?;
    let timeout = parsed.duration("timeout", Duration::from_secs(1))?;

    let states: Vec<State> = nodes.iter().map(|url| probe(url, &key, timeout)).collect();
    let quorum = nodes.len() / 2 + 1;
    println!("key {key:?} on {} nodes (quorum {quorum})", nodes.len());
    println!(
        "{:>4}  {:<28} {:<12} {:<16} {:>10}",
        "node", "address", "state", "holder", "pttl"
    );
    for (i, (url, state)) in nodes.iter().zip(&states).enumerate() {
        let (label, holder, pttl) = match state {
            State::Unreachable(why) => ("unreachable", why.clone(), String::new()),
            State::Free => ("free", "-".into(), "-".into()),
            State::Held { token, pttl_ms } => ("held", prefix(token), pttl(*pttl_ms)),
            State::Other { kind, pttl_ms } => ("other", format!("type {kind}"), pttl(*pttl_ms)),
        };
        println!("{i:>4}  {url:<28} {label:<12} {holder:<16} {pttl:>10}");
    }

    let reachable = states
        .iter()
        .filter(|s| !matches!(s, State::Unreachable(_)))
        .count();
    // The holder on the most nodes, and on how many.
    let mut best: Option<(&[u8], usize, i64)> = None;
    for s in &states {
        if let State::Held { token, .. } = s {
            let on: Vec<i64> = states
                .iter()
                .filter_map(|o| match o {
                    State::Held { token: t, pttl_ms } if t == token => Some(*pttl_ms),
                    _ => None,
                })
                .collect();
            let min_pttl = on.iter().copied().min().unwrap_or(0);
            if best.is_none_or(|(_, n, _)| on.len() > n) {
                best = Some((token, on.len(), min_pttl));
            }
        }
    }
    print!("summary: {reachable}/{} nodes reachable; ", nodes.len());
    match best {
        Some((token, on, min_pttl)) if on >= quorum => println!(
            "HELD by {} on {on}/{} nodes (quorum {quorum}), expires in {} at the earliest",
            prefix(token),
            nodes.len(),
            pttl(min_pttl)
        ),
        Some((token, on, _)) => println!(
            "not held on a quorum: {} holds {on}/{} nodes (quorum {quorum})",
            prefix(token),
            nodes.len()
        ),
        None if reachable >= quorum => println!("FREE on a quorum"),
        None => println!("unknown: fewer than a quorum of nodes answered"),
    }
    Ok(0)
}

fn probe(url: &str, key: &str, timeout: Duration) -> State {
    let mut conn = match NodeConn::connect(url, timeout) {
        Ok(c) => c,
        Err(e) => return State::Unreachable(e.kind().to_string()),
    };
    let key = key.as_bytes();
    let kind = match conn.call_ok(&[b"TYPE", key]) {
        Ok(Value::Simple(t)) => String::from_utf8_lossy(&t).into_owned(),
        Ok(_) => "unknown".into(),
        Err(e) => return State::Unreachable(e.to_string()),
    };
    let pttl_ms = match conn.call_ok(&[b"PTTL", key]) {
        Ok(Value::Integer(n)) => n,
        Ok(_) => -1,
        Err(e) => return State::Unreachable(e.to_string()),
    };
    match kind.as_str() {
        "none" => State::Free,
        "string" => match conn.call_ok(&[b"GET", key]) {
            Ok(Value::Bulk(Some(token))) => State::Held { token, pttl_ms },
            Ok(_) => State::Free,
            Err(e) => State::Unreachable(e.to_string()),
        },
        _ => State::Other { kind, pttl_ms },
    }
}

fn prefix(token: &[u8]) -> String {
    let shown = &token[..token.len().min(TOKEN_PREFIX)];
    let mut s = String::from_utf8_lossy(shown).into_owned();
    if token.len() > TOKEN_PREFIX {
        s.push('…');
    }
    s
}

fn pttl(ms: i64) -> String {
    match ms {
        -1 => "no expiry".into(),
        -2 => "-".into(),
        ms => format!("{ms}ms"),
    }
}
