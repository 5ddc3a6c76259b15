//! Instructions per `try_lock` + release cycle, for callgrind: this client or the ideal quorum
//! client (`rawQ`, kit/src/raw.rs) over N = 5 local redis-server processes.
//!
//! ```text
//! cargo build --release --example cycles
//! valgrind --tool=callgrind --toggle-collect='*cycles::measured*' \
//!     target/release/examples/cycles ours 2000
//! ```
//!
//! Only `measured` (the cycles after the warm-up) is counted; divide the total by the cycle
//! count. `.ci/callgrind-cycles` runs both clients and prints the figures and their ratio.

use std::hint::black_box;
use std::time::Duration;

use redlock_mux_kit::local_servers::RedisCluster;
use redlock_mux_kit::raw::{Raw, Tokens};

const N: usize = 5;
const WARM_UP: usize = 200;
const TTL: Duration = Duration::from_secs(10);
const KEY: &str = "cycles:key";

enum Who {
    Ours(redlock_mux::Client),
    RawQ(Raw, Tokens),
}

fn cycle(who: &mut Who) {
    match who {
        Who::Ours(client) => {
            let lock = client.try_lock(KEY, TTL).expect("try_lock");
            lock.release().expect("release");
        }
        Who::RawQ(raw, tokens) => {
            let token = tokens.next_token();
            assert!(raw
                .try_acquire(KEY.as_bytes(), &token, TTL.as_millis() as u64)
                .expect("try_acquire"));
            raw.release(KEY.as_bytes(), &token).expect("release");
        }
    }
}

/// The counted cycles: callgrind's `--toggle-collect` names this function.
#[inline(never)]
fn measured(who: &mut Who, cycles: usize) {
    for _ in 0..cycles {
        cycle(black_box(&mut *who));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_default();
    let cycles: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let servers = RedisCluster::start(N).expect("servers start");
    let mut who = match which.as_str() {
        "ours" => Who::Ours(redlock_mux::Client::new(servers.urls()).expect("client")),
        "rawq" => Who::RawQ(
            Raw::connect(&servers.addrs()).expect("connect").at_quorum(),
            Tokens::new(),
        ),
        _ => {
            eprintln!("usage: cycles ours|rawq [CYCLES]");
            std::process::exit(2);
        }
    };
    for _ in 0..WARM_UP {
        cycle(&mut who);
    }
    measured(&mut who, cycles);
    println!("{which}: {cycles} cycles");
}
