//! The simulated node against a real `redis-server`: the same command bytes, from the real
//! ops' `encode`, go to both, and the replies must match, so the model cannot drift from Redis.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::local_servers::RedisServer;
use super::node::Node;
use super::Rng;
use crate::core::ops::{Acquire, Extend, Op, Release, ScriptForm};
use crate::resp::{self, Limits, Status, Value};

/// One blocking connection to the real server.
struct Real {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Real {
    fn connect(addr: SocketAddr) -> Real {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        Real {
            stream,
            buf: Vec::new(),
        }
    }

    fn call(&mut self, command: &[u8]) -> Value {
        self.stream.write_all(command).expect("write");
        loop {
            if let Ok(Status::Complete((r, n))) = resp::decode(&self.buf, &Limits::default()) {
                let v = r.to_value();
                self.buf.drain(..n);
                return v;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("read");
            assert!(n > 0, "redis-server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn value(bytes: &[u8]) -> Value {
    match resp::decode(bytes, &Limits::default()) {
        Ok(Status::Complete((r, n))) if n == bytes.len() => r.to_value(),
        other => panic!("the simulated node sent an undecodable reply: {other:?}"),
    }
}

fn encode(op: &dyn Op, form: ScriptForm) -> Vec<u8> {
    let mut out = Vec::new();
    op.encode(&mut out, form);
    out
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    resp::encode_command(&mut out, args);
    out
}

struct Pair {
    real: Real,
    sim: Node,
    start: Instant,
    compared: usize,
}

impl Pair {
    /// Sends `cmd` to both and returns both replies. The simulated node's clock is this
    /// process's elapsed time, so expiry is compared in real time too.
    fn both(&mut self, cmd: &[u8]) -> (Value, Value) {
        let real = self.real.call(cmd);
        let now = self.start.elapsed().as_millis() as i64 + 1_000_000;
        let sim = value(&self.sim.execute(now, cmd));
        self.compared += 1;
        (real, sim)
    }

    fn same(&mut self, cmd: &[u8], what: &str) {
        let (real, sim) = self.both(cmd);
        assert_eq!(
            real, sim,
            "{what}: redis-server and the simulated node differ"
        );
    }

    /// `PTTL`: both missing, both without expiry, or both within a second of each other.
    fn close_ttl(&mut self, key: &[u8]) {
        match self.both(&command(&[b"PTTL", key])) {
            (Value::Integer(a), Value::Integer(b)) if a < 0 || b < 0 => assert_eq!(a, b),
            (Value::Integer(a), Value::Integer(b)) => assert!((a - b).abs() < 1000, "{a} {b}"),
            other => panic!("PTTL replies {other:?}"),
        }
    }
}

#[test]
fn simulated_node_answers_like_redis_server() {
    let server = RedisServer::start().expect("start redis-server");
    let mut pair = Pair {
        real: Real::connect(server.addr()),
        sim: Node::default(),
        start: Instant::now(),
        compared: 0,
    };
    let mut rng = Rng::new(0x5eed);
    let keys: [&[u8]; 4] = [b"lock:a", b"lock:b", b"lock:c", b"lock:d"];
    let tokens: [&[u8]; 3] = [
        b"0000000000000000000000000000000000000001",
        b"0000000000000000000000000000000000000002",
        b"ffffffffffffffffffffffffffffffffffffffff",
    ];
    // Long TTLs: nothing expires during this phase, so every reply must match exactly.
    for i in 0..400 {
        let key = keys[rng.below(4) as usize];
        let token = tokens[rng.below(3) as usize];
        let ttl_ms = rng.range(100_000, 200_000);
        let form = if rng.chance(0.5) {
            ScriptForm::Sha
        } else {
            ScriptForm::Body
        };
        let cmd = match rng.below(7) {
            0 | 1 => encode(&Acquire { key, token, ttl_ms }, form),
            2 | 3 => encode(&Release { key, token }, form),
            4 => encode(&Extend { key, token, ttl_ms }, form),
            5 => command(&[b"GET", key]),
            _ => {
                pair.close_ttl(key);
                continue;
            }
        };
        pair.same(&cmd, &format!("op {i}: {}", String::from_utf8_lossy(&cmd)));
    }
    // Sorted sets and type errors, for the read-write lock scripts.
    for cmd in [
        command(&[b"ZADD", b"rw:a", b"5", b"x", b"7", b"y"]),
        command(&[b"ZADD", b"rw:a", b"9", b"x"]),
        command(&[b"ZCARD", b"rw:a"]),
        command(&[b"GET", b"rw:a"]),
        command(&[b"ZREM", b"rw:a", b"x", b"nope"]),
        command(&[b"ZREM", b"rw:a", b"y"]),
        command(&[b"EXISTS", b"rw:a"]),
        command(&[b"SET", b"k", b"v", b"PX", b"0"]),
        command(&[b"SET", b"k", b"v", b"NX", b"PX", b"x1"]),
        command(&[b"EVALSHA", b"0123", b"0"]),
    ] {
        pair.same(&cmd, &String::from_utf8_lossy(&cmd));
    }
    // Expiry, coarsely: 30 ms keys are gone after 300 ms, 60 s keys are not.
    for (i, key) in keys.iter().enumerate() {
        pair.same(&command(&[b"DEL", key]), "DEL");
        let ttl_ms = if i % 2 == 0 { 30 } else { 60_000 };
        let acquire = Acquire {
            key,
            token: tokens[0],
            ttl_ms,
        };
        pair.same(&encode(&acquire, ScriptForm::Sha), "short SET");
    }
    std::thread::sleep(Duration::from_millis(300));
    for key in keys {
        pair.same(&command(&[b"GET", key]), "GET after expiry");
        let extend = Extend {
            key,
            token: tokens[0],
            ttl_ms: 60_000,
        };
        pair.same(&encode(&extend, ScriptForm::Sha), "extend after expiry");
        let release = Release {
            key,
            token: tokens[0],
        };
        pair.same(&encode(&release, ScriptForm::Sha), "release after expiry");
        pair.close_ttl(key);
    }
    assert!(pair.compared > 400, "{} commands compared", pair.compared);
    println!("differential: {} commands compared", pair.compared);
}
