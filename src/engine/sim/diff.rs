//! The simulated node against a real `redis-server`: the same command bytes, from the real
//! ops' `encode`, go to both, and the replies must match, so the model cannot drift from Redis.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::local_servers::RedisServer;
use super::node::Node;
use super::Rng;
use crate::engine::fair::{AttemptIds, FairAcquire, FairState, Leave, QueueKeys};
use crate::engine::fencing::{
    FairFencedAcquire, FenceRead, FenceWrite, FencedAcquire, FencedWriteAcquire,
};
use crate::engine::keys::{fence_key, SemKeys};
use crate::engine::multi::{AcquireAll, ExtendAll, FairAcquireAll, ReleaseAll};
use crate::engine::ops::write_eval;
use crate::engine::ops::{Acquire, Extend, Op, Release, ScriptForm};
use crate::engine::rw::{
    Downgrade, DowngradeUndo, FairRwAcquire, ReadAcquire, ReadExtend, ReadRelease, RwKeys,
    SetRelease, WriteAcquire, WriteCleanup, WriteExtend, WriteRelease,
};
use crate::engine::sem::{
    FairSemAcquire, FairSemKeyAcquire, SemAcquire, SemExtend, SemKeyAcquire, SemKeyExtend,
    SemKeyRelease, SemRelease, MISMATCH as SEM_MISMATCH, SEM_COUNT,
};
use crate::resp::{self, Limits, ServerErrorKind, Status, Value};

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
        self.next()
    }

    /// The next reply (or pushed message) from the server.
    fn next(&mut self) -> Value {
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
    compared: usize,
}

impl Pair {
    fn new(server: &RedisServer) -> Pair {
        Pair {
            real: Real::connect(server.addr()),
            sim: Node::default(),
            compared: 0,
        }
    }

    /// Sends `cmd` to both and returns both replies. The simulated node's clock is the wall
    /// clock, which `redis-server` reads too: expiry and the scripts' `TIME` agree to a few ms.
    fn both(&mut self, cmd: &[u8]) -> (Value, Value) {
        let real = self.real.call(cmd);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as i64;
        let sim = value(&self.sim.execute(now, cmd));
        self.compared += 1;
        (real, sim)
    }

    /// The same reply from both, errors alike as [`same_error`] has it.
    fn same(&mut self, cmd: &[u8], what: &str) {
        let (real, sim) = self.both(cmd);
        assert!(
            alike(&real, &sim, false),
            "{what}: redis-server and the simulated node differ: {} against {}",
            shown(&real),
            shown(&sim)
        );
    }

    /// `ZSCORE`: both missing, or scores within a second (they come from each side's `TIME`).
    fn close_score(&mut self, key: &[u8], member: &[u8]) {
        let score = |v: &Value| match v {
            Value::Bulk(Some(b)) => Some(
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.parse::<f64>().ok())
                    .expect("a score"),
            ),
            Value::Bulk(None) => None,
            other => panic!("ZSCORE reply {other:?}"),
        };
        let (real, sim) = self.both(&command(&[b"ZSCORE", key, member]));
        match (score(&real), score(&sim)) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1000.0, "ZSCORE {a} against {b}"),
            (a, b) => assert_eq!(a, b, "ZSCORE"),
        }
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
    let mut pair = Pair::new(&server);
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
        command(&[b"SET", b"k", b"v", b"NX", b"PX", b"1000", b"GET"]),
        command(&[b"SET", b"k", b"w", b"NX", b"PX", b"1000", b"GET"]),
        command(&[b"SET", b"rw:a", b"v", b"NX", b"PX", b"1000", b"GET"]),
        command(&[b"SET", b"k", b"x", b"PX", b"1000", b"GET"]),
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

/// The scripts of read-write locks, the fair queue, all-or-none sets and fencing, through their
/// real ops, random sequences with long TTLs first (every reply must match), then expiry.
#[test]
fn every_lock_script_answers_like_redis_server() {
    let server = RedisServer::start().expect("start redis-server");
    let mut pair = Pair::new(&server);
    let mut rng = Rng::new(0x5c41);
    let tokens: [&[u8]; 3] = [
        b"0000000000000000000000000000000000000001",
        b"0000000000000000000000000000000000000002",
        b"ffffffffffffffffffffffffffffffffffffffff",
    ];
    let rw = [RwKeys::new(b"doc:a"), RwKeys::new(b"{doc}:b")];
    let fair_keys: [&[u8]; 2] = [b"job:a", b"{job}:b"];
    let multi_keys: [&[u8]; 3] = [b"m:a", b"m:b", b"m:c"];
    let fence_lock: [&[u8]; 2] = [b"f:a", b"f:b"];
    let fences = [fence_key(fence_lock[0]), fence_key(fence_lock[1])];
    let writer_fences = [fence_key(rw[0].writer()), fence_key(rw[1].writer())];
    let mut kinds = [0usize; 29];
    for i in 0..800 {
        let t = rng.below(3) as usize;
        let token = tokens[t];
        // A waiter's id stays while its attempts' tokens change: any of the three with any.
        let w = rng.below(3) as usize;
        let waiter = tokens[w];
        let ids = AttemptIds { waiter, token };
        let ttl_ms = rng.range(100_000, 200_000);
        let long = rng.range(100_000, 200_000);
        let form = if rng.chance(0.5) {
            ScriptForm::Sha
        } else {
            ScriptForm::Body
        };
        let fair_key = fair_keys[rng.below(2) as usize];
        let f = rng.below(2) as usize;
        let mask = rng.range(1, 7) as usize;
        let set: Vec<&[u8]> = (0..3)
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| multi_keys[b])
            .collect();
        let intent_ms = if rng.chance(0.5) { 0 } else { long };
        let r = rng.below(2) as usize;
        let k = &rw[r];
        let kind = rng.below(29) as usize;
        kinds[kind] += 1;
        let cmd = match kind {
            0 | 1 => encode(
                &WriteAcquire {
                    keys: k,
                    ids,
                    ttl_ms,
                    intent_ms,
                },
                form,
            ),
            2 => encode(
                &WriteCleanup {
                    resource: b"doc",
                    keys: k,
                    ids,
                    intent_ms,
                },
                form,
            ),
            3 => encode(
                &WriteRelease {
                    resource: b"doc",
                    keys: k,
                    token,
                },
                form,
            ),
            4 | 5 => encode(
                &ReadAcquire {
                    keys: k,
                    token,
                    ttl_ms,
                    native: false,
                },
                form,
            ),
            6 => {
                let (set, token) = if rng.chance(0.5) {
                    (k.readers(), token)
                } else {
                    (k.intents(), waiter)
                };
                encode(
                    &SetRelease {
                        resource: b"doc",
                        set,
                        token,
                    },
                    form,
                )
            }
            7 => encode(
                &ReadExtend {
                    keys: k,
                    token,
                    ttl_ms,
                },
                form,
            ),
            8 => encode(
                &Extend {
                    key: k.writer(),
                    token,
                    ttl_ms,
                },
                form,
            ),
            9 | 10 => {
                // Equal tickets are ordered by waiter id, as Redis orders equal scores by
                // member.
                let ticket = [7, 7, 3][w] + rng.below(2);
                let fair = FairState::new(ticket, long, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                encode(&FairAcquire::new(fair_key, ids, ttl_ms, &fair), form)
            }
            11 => encode(
                &Leave {
                    resource: fair_key,
                    keys: QueueKeys::Mutex(fair_key),
                    kind: b"",
                    family: crate::engine::keys::Family::Mutex,
                    waiter,
                },
                form,
            ),
            12 => encode(
                &Release {
                    key: fair_key,
                    token,
                },
                form,
            ),
            13 => encode(
                &AcquireAll {
                    keys: &set,
                    token,
                    ttl_ms,
                },
                form,
            ),
            14 => encode(&ReleaseAll::new(&set, token), form),
            15 => encode(
                &ExtendAll {
                    keys: &set,
                    token,
                    ttl_ms,
                },
                form,
            ),
            16 => encode(
                &FencedAcquire {
                    key: fence_lock[f],
                    fence: &fences[f],
                    token,
                    ttl_ms,
                    read: &FenceRead::new(),
                },
                form,
            ),
            17 => encode(
                &FenceWrite {
                    key: fence_lock[f],
                    fence: &fences[f],
                    token,
                    value: rng.range(0, 40),
                },
                form,
            ),
            18 => encode(
                &Release {
                    key: fence_lock[f],
                    token,
                },
                form,
            ),
            19 | 20 => {
                let ticket = [7, 7, 3][w] + rng.below(2);
                let fair = FairState::new(ticket, long, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = if kind == 19 {
                    FairRwAcquire::write(k, ids, ttl_ms, intent_ms, &fair)
                } else {
                    FairRwAcquire::read(k, ids, ttl_ms, &fair)
                };
                encode(&op, form)
            }
            21 => {
                let ticket = [7, 7, 3][w] + rng.below(2);
                let fair = FairState::new(ticket, long, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = FairFencedAcquire {
                    key: fence_lock[f],
                    fence: &fences[f],
                    ids,
                    ttl_ms,
                    fair: &fair,
                    read: &FenceRead::new(),
                };
                encode(&op, form)
            }
            22 | 23 => {
                let ticket = [7, 7, 3][w] + rng.below(2);
                let fair = FairState::new(ticket, long, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = FencedWriteAcquire {
                    keys: k,
                    fence: &writer_fences[r],
                    ids,
                    ttl_ms,
                    intent_ms,
                    fair: (kind == 23).then_some(&fair),
                    read: &FenceRead::new(),
                };
                encode(&op, form)
            }
            24 => {
                let ticket = [7, 7, 3][w] + rng.below(2);
                let fair = FairState::new(ticket, long, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = FairAcquireAll {
                    keys: &set,
                    ids,
                    ttl_ms,
                    fair: &fair,
                };
                encode(&op, form)
            }
            25 | 26 => encode(
                &Downgrade {
                    resource: b"doc",
                    keys: k,
                    token,
                    ttl_ms,
                },
                form,
            ),
            27 => encode(
                &DowngradeUndo {
                    resource: b"doc",
                    keys: k,
                    token,
                },
                form,
            ),
            _ => {
                // Look at the state: the queue in order, set sizes, counters, expiries, scores.
                for cmd in [
                    command(&[b"ZRANGE", &queue_key(fair_key), b"0", b"-1"]),
                    command(&[b"ZRANGE", &queue_key(multi_keys[0]), b"0", b"-1"]),
                    command(&[b"ZRANGE", &queue_key(fence_lock[f]), b"0", b"-1"]),
                    command(&[b"GET", &writer_fences[r]]),
                    command(&[b"ZCARD", k.readers()]),
                    command(&[b"ZRANGE", k.queue(), b"0", b"-1"]),
                    command(&[b"ZCARD", k.intents()]),
                    command(&[b"GET", k.writer()]),
                    command(&[b"GET", &fences[f]]),
                    command(&[b"EXISTS", multi_keys[0], multi_keys[1], multi_keys[2]]),
                ] {
                    pair.same(&cmd, &format!("op {i}: {}", String::from_utf8_lossy(&cmd)));
                }
                pair.close_score(k.readers(), token);
                pair.close_score(k.intents(), waiter);
                pair.close_ttl(k.readers());
                pair.close_ttl(&queue_key(fair_key));
                continue;
            }
        };
        pair.same(&cmd, &format!("op {i}: {}", String::from_utf8_lossy(&cmd)));
    }
    assert!(kinds.iter().all(|&n| n > 0), "every kind ran: {kinds:?}");

    // Semaphores: acquires with a shape that sometimes disagrees with the marker, fair
    // waiters, extends, releases, leaves and counts.
    let sems = [SemKeys::new(b"sem:a"), SemKeys::new(b"{sem}:b")];
    let mut sem_kinds = [0usize; 11];
    for i in 0..400 {
        let token = tokens[rng.below(3) as usize];
        let w = rng.below(3) as usize;
        let ids = AttemptIds {
            waiter: tokens[w],
            token,
        };
        let s = &sems[rng.below(2) as usize];
        let ttl_ms = rng.range(100_000, 200_000);
        // The shape: mostly 2 permits with 2 slots per node; now and then 3 permits, or 2
        // permits with 1 slot per node (as a client of N = 5 nodes picks).
        let shape = match rng.below(20) {
            0 => crate::engine::sem::shape_arg(3, 3),
            1 => crate::engine::sem::shape_arg(2, 1),
            _ => 2,
        };
        let form = if rng.chance(0.5) {
            ScriptForm::Sha
        } else {
            ScriptForm::Body
        };
        let kind = rng.below(11) as usize;
        sem_kinds[kind] += 1;
        // One slot per node: the key of 2 permits, now and then 1 (another number of permits).
        let permits = if rng.chance(0.1) { 1 } else { 2 };
        let what = format!("semaphore op {i} ({kind})");
        match kind {
            0 | 1 => {
                let op = SemAcquire {
                    keys: s,
                    token,
                    ttl_ms,
                    shape,
                };
                pair.same(&encode(&op, form), &what);
            }
            2 => {
                let fair = FairState::new([7, 7, 3][w] + rng.below(2), ttl_ms, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = FairSemAcquire {
                    keys: s,
                    ids,
                    ttl_ms,
                    shape,
                    fair: &fair,
                };
                pair.same(&encode(&op, form), &what);
            }
            3 => {
                let op = SemExtend {
                    holders: s.holders(),
                    token,
                    ttl_ms,
                };
                pair.same(&encode(&op, form), &what);
            }
            4 => {
                let op = SemRelease {
                    resource: b"sem",
                    holders: s.holders(),
                    token,
                };
                pair.same(&encode(&op, form), &what);
                pair.same(&command(&[b"EXISTS", s.holders()]), &what);
            }
            5 => {
                let op = Leave {
                    resource: b"sem",
                    keys: QueueKeys::Named {
                        lock: s.holders(),
                        queue: s.queue(),
                        expiries: s.queue_expiries(),
                    },
                    kind: b"",
                    family: crate::engine::keys::Family::Semaphore,
                    waiter: tokens[w],
                };
                pair.same(&encode(&op, form), &what);
            }
            7 => {
                let op = SemKeyAcquire {
                    key: s.holders(),
                    token,
                    ttl_ms,
                    permits,
                };
                pair.same(&encode(&op, form), &what);
            }
            8 => {
                let fair = FairState::new([7, 7, 3][w] + rng.below(2), ttl_ms, Duration::ZERO);
                if rng.chance(0.5) {
                    fair.on_retry(Duration::ZERO);
                }
                let op = FairSemKeyAcquire {
                    keys: s,
                    ids,
                    ttl_ms,
                    permits,
                    fair: &fair,
                };
                pair.same(&encode(&op, form), &what);
            }
            9 => {
                let op = SemKeyExtend {
                    key: s.holders(),
                    token,
                    ttl_ms,
                    permits,
                };
                pair.same(&encode(&op, form), &what);
            }
            10 => {
                let op = SemKeyRelease {
                    resource: b"sem",
                    key: s.holders(),
                    token,
                    permits,
                };
                pair.same(&encode(&op, form), &what);
                pair.same(&command(&[b"GET", s.holders()]), &what);
            }
            _ => {
                let mut count = Vec::new();
                write_eval(&mut count, &SEM_COUNT, form, &[s.holders()], &[]);
                pair.same(&count, &what);
                pair.same(&command(&[b"ZRANGE", s.queue(), b"0", b"-1"]), &what);
                pair.same(&command(&[b"ZSCORE", s.holders(), b"="]), &what);
                pair.close_ttl(s.holders());
            }
        }
    }
    assert!(
        sem_kinds.iter().all(|&n| n > 0),
        "every kind ran: {sem_kinds:?}"
    );

    // Fence counters that are not whole numbers, or exhausted, or written oddly.
    let read = FenceRead::new();
    let acquire = |token| FencedAcquire {
        key: b"fc",
        fence: b"fc:n",
        token,
        ttl_ms: 100_000,
        read: &read,
    };
    for counter in [
        &b"abc"[..],
        b"1.5",
        b"-3",
        b"9007199254740991",
        b"0x10",
        b" 7 ",
        b"12",
    ] {
        pair.same(&command(&[b"DEL", b"fc"]), "DEL");
        pair.same(&command(&[b"SET", b"fc:n", counter]), "SET");
        let what = format!("fenced acquire over {}", String::from_utf8_lossy(counter));
        pair.same(&encode(&acquire(tokens[0]), ScriptForm::Body), &what);
        let write = FenceWrite {
            key: b"fc",
            fence: b"fc:n",
            token: tokens[0],
            value: 10,
        };
        pair.same(&encode(&write, ScriptForm::Sha), "fence write");
        pair.same(&command(&[b"GET", b"fc:n"]), "counter after");
    }
    // Type errors inside scripts.
    pair.same(&command(&[b"ZADD", b"fc", b"1", b"x"]), "ZADD");
    pair.same(
        &encode(&acquire(tokens[0]), ScriptForm::Sha),
        "lock key is a set",
    );
    pair.same(&command(&[b"SET", b"{rw:t}:r", b"str"]), "SET");
    let t = RwKeys::new(b"t");
    let read = ReadAcquire {
        keys: &t,
        token: tokens[1],
        ttl_ms: 1000,
        native: false,
    };
    pair.same(&encode(&read, ScriptForm::Sha), "reader set is a string");
    // A key of a set that someone else turned into another type: extending the set is refused,
    // and releasing it still frees the keys after that one.
    let set = [multi_keys[0], multi_keys[1], multi_keys[2]];
    pair.same(&command(&[b"DEL", set[0], set[1], set[2]]), "DEL");
    let take = AcquireAll {
        keys: &set,
        token: tokens[0],
        ttl_ms: 100_000,
    };
    pair.same(&encode(&take, ScriptForm::Sha), "set taken");
    pair.same(&command(&[b"DEL", set[1]]), "DEL");
    pair.same(&command(&[b"ZADD", set[1], b"1", b"x"]), "ZADD");
    let extend = ExtendAll {
        keys: &set,
        token: tokens[0],
        ttl_ms: 200_000,
    };
    pair.same(&encode(&extend, ScriptForm::Body), "extend past a set");
    pair.close_ttl(set[2]);
    let release = ReleaseAll::new(&set, tokens[0]);
    pair.same(&encode(&release, ScriptForm::Sha), "release past a set");
    pair.same(&command(&[b"EXISTS", set[0], set[1], set[2]]), "EXISTS");
    pair.same(&encode(&take, ScriptForm::Body), "acquire over a set");

    // Behind a fair queue, a writer's intent holds back only readers outside the queue.
    pair.same(&command(&[b"FLUSHALL"]), "FLUSHALL");
    let k = &rw[1];
    let holder = ReadAcquire {
        keys: k,
        token: tokens[0],
        ttl_ms: 60_000,
        native: false,
    };
    pair.same(&encode(&holder, ScriptForm::Sha), "a reader holds");
    let waiting = WriteAcquire {
        keys: k,
        ids: AttemptIds {
            waiter: tokens[1],
            token: tokens[0],
        },
        ttl_ms: 60_000,
        intent_ms: 60_000,
    };
    pair.same(
        &encode(&waiting, ScriptForm::Sha),
        "a writer leaves an intent",
    );
    // Its next attempt has a token of its own, and still one intent.
    let next = WriteAcquire {
        ids: AttemptIds {
            waiter: tokens[1],
            token: tokens[2],
        },
        ..waiting
    };
    pair.same(&encode(&next, ScriptForm::Sha), "the writer's next attempt");
    let (real, sim) = pair.both(&command(&[b"ZCARD", k.intents()]));
    assert_eq!((&real, &sim), (&Value::Integer(1), &Value::Integer(1)));
    let queue_place = FairState::new(5, 60_000, Duration::ZERO);
    let fair_reader = |join: bool| {
        let ids = AttemptIds {
            waiter: tokens[2],
            token: tokens[2],
        };
        if join {
            queue_place.on_retry(Duration::ZERO);
        }
        let op = FairRwAcquire::read(k, ids, 60_000, &queue_place);
        encode(&op, ScriptForm::Sha)
    };
    let (real, sim) = pair.both(&fair_reader(false));
    assert_eq!((&real, &sim), (&Value::Integer(0), &Value::Integer(0)));
    let (real, sim) = pair.both(&fair_reader(true));
    assert_eq!((&real, &sim), (&Value::Integer(1), &Value::Integer(1)));

    // Expiry: readers, intents and queue entries of 30 ms are gone after 300 ms.
    pair.same(&command(&[b"FLUSHALL"]), "FLUSHALL");
    let k = &rw[0];
    let short = |token| ReadAcquire {
        keys: k,
        token,
        ttl_ms: 30,
        native: false,
    };
    pair.same(&encode(&short(tokens[0]), ScriptForm::Sha), "short reader");
    let waiting_writer = WriteAcquire {
        keys: k,
        ids: AttemptIds {
            waiter: tokens[1],
            token: tokens[1],
        },
        ttl_ms: 60_000,
        intent_ms: 30,
    };
    pair.same(
        &encode(&waiting_writer, ScriptForm::Sha),
        "writer leaves an intent",
    );
    let queued = |token: &[u8], ticket| {
        let fair = FairState::new(ticket, 30, Duration::ZERO);
        let ids = AttemptIds {
            waiter: token,
            token,
        };
        fair.on_retry(Duration::ZERO);
        let op = FairAcquire::new(fair_keys[0], ids, 60_000, &fair);
        encode(&op, ScriptForm::Sha)
    };
    pair.same(&command(&[b"SET", fair_keys[0], b"held"]), "SET");
    pair.same(&queued(tokens[0], 1), "queued");
    std::thread::sleep(Duration::from_millis(300));
    let reader_extend = ReadExtend {
        keys: k,
        token: tokens[0],
        ttl_ms: 60_000,
    };
    pair.same(
        &encode(&reader_extend, ScriptForm::Sha),
        "extend of an expired reader",
    );
    pair.same(
        &encode(&short(tokens[2]), ScriptForm::Sha),
        "reader after the intent expired",
    );
    pair.same(&command(&[b"ZCARD", k.readers()]), "expired reader pruned");
    pair.same(&command(&[b"DEL", fair_keys[0]]), "DEL");
    pair.same(&queued(tokens[1], 2), "dead entry pruned");
    pair.same(
        &command(&[b"ZRANGE", &queue_key(fair_keys[0]), b"0", b"-1"]),
        "queue after",
    );
    assert!(pair.compared > 800, "{} commands compared", pair.compared);
    println!(
        "differential (lock scripts): {} commands compared, by kind {kinds:?}",
        pair.compared
    );
}

/// A queued fair waiter is told its rank: how many entries ahead of it must leave before it may
/// pass (for a reader, those up to the last writer ahead), by every fair script, the same by
/// the model as by Redis.
#[test]
fn fair_refusals_carry_the_rank_like_redis_server() {
    let server = RedisServer::start().expect("start redis-server");
    let mut pair = Pair::new(&server);
    let ids = |waiter: &'static [u8]| AttemptIds {
        waiter,
        token: waiter,
    };
    let joined = |ticket| {
        let fair = FairState::new(ticket, 60_000, Duration::ZERO);
        fair.on_retry(Duration::ZERO);
        fair
    };
    let check = |pair: &mut Pair, cmd: Vec<u8>, want: i64, what: &str| {
        let (real, sim) = pair.both(&cmd);
        assert_eq!(
            (&real, &sim),
            (&Value::Integer(want), &Value::Integer(want)),
            "{what}"
        );
    };
    let waiters: [&'static [u8]; 5] = [b"w1", b"w2", b"w3", b"w4", b"w5"];

    // A held mutex: the head is refused by the lock (2), the others by the queue (2 + rank).
    let key: &[u8] = b"rank:m";
    pair.same(&command(&[b"SET", key, b"held"]), "SET");
    for (i, w) in waiters[..3].iter().enumerate() {
        let fair = joined(i as u64 + 1);
        let op = FairAcquire::new(key, ids(w), 60_000, &fair);
        check(
            &mut pair,
            encode(&op, ScriptForm::Body),
            2 + i as i64,
            "mutex",
        );
    }
    // Asking again (by digest now that the server has the script) keeps the place.
    let fair = joined(3);
    let op = FairAcquire::new(key, ids(waiters[2]), 60_000, &fair);
    check(&mut pair, encode(&op, ScriptForm::Sha), 4, "mutex again");

    // The fenced mutex: -1 - rank.
    let key: &[u8] = b"rank:f";
    let fence = fence_key(key);
    pair.same(&command(&[b"SET", key, b"held"]), "SET");
    let read = FenceRead::new();
    for (i, w) in waiters[..3].iter().enumerate() {
        let fair = joined(i as u64 + 1);
        let op = FairFencedAcquire {
            key,
            fence: &fence,
            ids: ids(w),
            ttl_ms: 60_000,
            fair: &fair,
            read: &read,
        };
        check(
            &mut pair,
            encode(&op, ScriptForm::Body),
            -1 - i as i64,
            "fenced",
        );
    }

    // A read-write lock held by a writer; queue w1 r2 r3 w4 r5: a reader waits for the last
    // writer ahead of it and everyone ahead of that writer.
    let k = RwKeys::new(b"rank:rw");
    pair.same(&command(&[b"SET", k.writer(), b"held"]), "SET");
    let want = [2, 3, 3, 5, 6];
    for (i, w) in waiters.iter().enumerate() {
        let fair = joined(i as u64 + 1);
        let cmd = if i == 0 || i == 3 {
            encode(
                &FairRwAcquire::write(&k, ids(w), 60_000, 0, &fair),
                ScriptForm::Body,
            )
        } else {
            encode(
                &FairRwAcquire::read(&k, ids(w), 60_000, &fair),
                ScriptForm::Body,
            )
        };
        check(&mut pair, cmd, want[i], "read-write");
    }
    // The fenced writer at the back: behind all five.
    let fence = fence_key(k.writer());
    let fair = joined(9);
    let op = FencedWriteAcquire {
        keys: &k,
        fence: &fence,
        ids: ids(b"w9"),
        ttl_ms: 60_000,
        intent_ms: 0,
        fair: Some(&fair),
        read: &read,
    };
    check(
        &mut pair,
        encode(&op, ScriptForm::Body),
        -6,
        "fenced writer",
    );

    // A set: its rank is the most entries ahead of it in any of its queues.
    let (a, b): (&[u8], &[u8]) = (b"rank:s:a", b"rank:s:b");
    pair.same(&command(&[b"SET", a, b"held"]), "SET");
    for (i, w) in waiters[..2].iter().enumerate() {
        let fair = joined(i as u64 + 1);
        let op = FairAcquire::new(a, ids(w), 60_000, &fair);
        pair.same(&encode(&op, ScriptForm::Body), "queue on a");
    }
    let set = [a, b];
    let fair = joined(5);
    let op = FairAcquireAll {
        keys: &set,
        ids: ids(b"s"),
        ttl_ms: 60_000,
        fair: &fair,
    };
    check(&mut pair, encode(&op, ScriptForm::Body), 2 + 2, "set");
}

/// The mutex fair queue's key of `key`.
fn queue_key(key: &[u8]) -> Vec<u8> {
    crate::engine::keys::Derived::MutexQueue.of(key).to_vec()
}

/// Every key the lock scripts write, and every channel they announce on, is one that
/// [`KeyNames`](crate::KeyNames) names for its resource; and every key KeyNames names is
/// written by some lock. Each lock kind's real ops run against a real `redis-server`, which
/// is asked for its keys after every command, while a pattern subscriber hears every
/// announcement.
#[test]
fn key_names_are_exactly_the_keys_the_locks_write() {
    use crate::engine::keys::KeyNames;
    use std::collections::BTreeSet;

    let server = RedisServer::start().expect("start redis-server");
    let mut real = Real::connect(server.addr());
    let mut listener = Real::connect(server.addr());
    listener.call(&command(&[b"PSUBSCRIBE", b"*"]));
    let (a, b): (&[u8], &[u8]) = (b"t1", b"t2");
    let ttl_ms = 60_000;
    let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut run = |real: &mut Real, cmd: &[u8]| {
        real.call(cmd);
        let Value::Array(Some(keys)) = real.call(&command(&[b"KEYS", b"*"])) else {
            panic!("KEYS did not answer an array");
        };
        for key in keys {
            let Value::Bulk(Some(key)) = key else {
                panic!("KEYS answered a non-bulk item");
            };
            seen.insert(key);
        }
    };
    let resources: [&[u8]; 3] = [b"doc:a", b"{doc}:b", b"a}b"];
    for r in resources {
        let ids = AttemptIds {
            waiter: a,
            token: a,
        };
        // Mutex: acquire, extend, release; cleanup is the same release.
        run(
            &mut real,
            &encode(
                &Acquire {
                    key: r,
                    token: a,
                    ttl_ms,
                },
                ScriptForm::Body,
            ),
        );
        run(
            &mut real,
            &encode(
                &Extend {
                    key: r,
                    token: a,
                    ttl_ms,
                },
                ScriptForm::Body,
            ),
        );
        // A fair mutex waiter that joins while the lock is held stays queued.
        let fair = FairState::new(1, 60_000, Duration::ZERO);
        fair.on_retry(Duration::ZERO);
        let ids_b = AttemptIds {
            waiter: b,
            token: b,
        };
        let fair_op = FairAcquire::new(r, ids_b, ttl_ms, &fair);
        run(&mut real, &encode(&fair_op, ScriptForm::Body));
        run(
            &mut real,
            &encode(&Release { key: r, token: a }, ScriptForm::Body),
        );
        let leave = Leave {
            resource: r,
            keys: QueueKeys::Mutex(r),
            kind: b"",
            family: crate::engine::keys::Family::Mutex,
            waiter: b,
        };
        run(&mut real, &encode(&leave, ScriptForm::Body));
        // Fenced mutex: the read, then the write-back.
        let fence = fence_key(r);
        let read = FenceRead::new();
        let fenced = FencedAcquire {
            key: r,
            fence: &fence,
            token: a,
            ttl_ms,
            read: &read,
        };
        run(&mut real, &encode(&fenced, ScriptForm::Body));
        let write_back = FenceWrite {
            key: r,
            fence: &fence,
            token: a,
            value: 7,
        };
        run(&mut real, &encode(&write_back, ScriptForm::Body));
        run(
            &mut real,
            &encode(&Release { key: r, token: a }, ScriptForm::Body),
        );
        // Read-write: a reader, a writer refused with an intent, a fair reader queued behind
        // the intent, and everything released again.
        let k = RwKeys::new(r);
        let reader = ReadAcquire {
            keys: &k,
            token: a,
            ttl_ms,
            native: false,
        };
        run(&mut real, &encode(&reader, ScriptForm::Body));
        let extend = ReadExtend {
            keys: &k,
            token: a,
            ttl_ms,
        };
        run(&mut real, &encode(&extend, ScriptForm::Body));
        let writer = WriteAcquire {
            keys: &k,
            ids: ids_b,
            ttl_ms,
            intent_ms: 60_000,
        };
        run(&mut real, &encode(&writer, ScriptForm::Body));
        let fair_reader = FairRwAcquire::read(&k, ids, ttl_ms, &fair);
        run(&mut real, &encode(&fair_reader, ScriptForm::Body));
        let fair_writer = FairRwAcquire::write(&k, ids_b, ttl_ms, 60_000, &fair);
        run(&mut real, &encode(&fair_writer, ScriptForm::Body));
        for (kind, waiter) in [(&b"r"[..], ids.waiter), (b"w", ids_b.waiter)] {
            let leave = Leave {
                resource: r,
                keys: crate::engine::rw::queue_keys(&k),
                kind,
                family: crate::engine::keys::Family::Rw,
                waiter,
            };
            run(&mut real, &encode(&leave, ScriptForm::Body));
        }
        for (set, token) in [(k.readers(), a), (k.intents(), b)] {
            let release = SetRelease {
                resource: r,
                set,
                token,
            };
            run(&mut real, &encode(&release, ScriptForm::Body));
        }
        run(&mut real, &encode(&writer, ScriptForm::Body));
        let cleanup = WriteCleanup {
            resource: r,
            keys: &k,
            ids: ids_b,
            intent_ms: 60_000,
        };
        run(&mut real, &encode(&cleanup, ScriptForm::Body));
        run(&mut real, &encode(&writer, ScriptForm::Body));
        let release = WriteRelease {
            resource: r,
            keys: &k,
            token: b,
        };
        run(&mut real, &encode(&release, ScriptForm::Body));
        // Fenced write lock: the writer key's counter.
        let writer_fence = fence_key(k.writer());
        let fenced_writer = FencedWriteAcquire {
            keys: &k,
            fence: &writer_fence,
            ids: ids_b,
            ttl_ms,
            intent_ms: 0,
            fair: None,
            read: &FenceRead::new(),
        };
        run(&mut real, &encode(&fenced_writer, ScriptForm::Body));
        run(&mut real, &encode(&release, ScriptForm::Body));
        // Semaphore: a holder, its extend, a fair waiter queued behind the one permit, the
        // count, and everything released again.
        let s = SemKeys::new(r);
        let holder = SemAcquire {
            keys: &s,
            token: a,
            ttl_ms,
            shape: 1,
        };
        run(&mut real, &encode(&holder, ScriptForm::Body));
        let extend = SemExtend {
            holders: s.holders(),
            token: a,
            ttl_ms,
        };
        run(&mut real, &encode(&extend, ScriptForm::Body));
        let fair_waiter = FairSemAcquire {
            keys: &s,
            ids: ids_b,
            ttl_ms,
            shape: 1,
            fair: &fair,
        };
        run(&mut real, &encode(&fair_waiter, ScriptForm::Body));
        let leave = Leave {
            resource: r,
            keys: QueueKeys::Named {
                lock: s.holders(),
                queue: s.queue(),
                expiries: s.queue_expiries(),
            },
            kind: b"",
            family: crate::engine::keys::Family::Semaphore,
            waiter: b,
        };
        run(&mut real, &encode(&leave, ScriptForm::Body));
        let release = SemRelease {
            resource: r,
            holders: s.holders(),
            token: a,
        };
        run(&mut real, &encode(&release, ScriptForm::Body));
    }
    // All-or-none over every resource at once.
    let acquire_all = AcquireAll {
        keys: &resources,
        token: a,
        ttl_ms,
    };
    run(&mut real, &encode(&acquire_all, ScriptForm::Body));
    let extend_all = ExtendAll {
        keys: &resources,
        token: a,
        ttl_ms,
    };
    run(&mut real, &encode(&extend_all, ScriptForm::Body));
    run(
        &mut real,
        &encode(&ReleaseAll::new(&resources, a), ScriptForm::Body),
    );

    let names: Vec<KeyNames> = resources.iter().map(|r| KeyNames::new(r)).collect();
    let named: BTreeSet<Vec<u8>> = names
        .iter()
        .flat_map(|n| n.keys().map(<[u8]>::to_vec))
        .collect();
    let show = |set: &BTreeSet<Vec<u8>>| -> Vec<String> {
        set.iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    };
    let unnamed: BTreeSet<Vec<u8>> = seen.difference(&named).cloned().collect();
    assert!(
        unnamed.is_empty(),
        "keys no KeyNames names: {:?}",
        show(&unnamed)
    );
    let unwritten: BTreeSet<Vec<u8>> = named.difference(&seen).cloned().collect();
    assert!(
        unwritten.is_empty(),
        "named but never written: {:?}",
        show(&unwritten)
    );

    // Every announcement went to a resource's wake channel, and every resource's was used.
    listener
        .stream
        .write_all(&command(&[b"PING"]))
        .expect("write");
    let mut channels: BTreeSet<Vec<u8>> = BTreeSet::new();
    // The messages already published come first; the PING's reply closes them.
    loop {
        let Value::Array(Some(items)) = listener.next() else {
            panic!("a subscriber got a non-array");
        };
        match items.as_slice() {
            [Value::Bulk(Some(kind)), _, Value::Bulk(Some(channel)), _] if kind == b"pmessage" => {
                channels.insert(channel.clone());
            }
            [Value::Bulk(Some(kind)), ..] if kind == b"pong" => break,
            other => panic!("a subscriber got {other:?}"),
        }
    }
    let wake: BTreeSet<Vec<u8>> = names.iter().map(|n| n.wake_channel.clone()).collect();
    assert_eq!(show(&channels), show(&wake));
}

/// The Redis 8 server for the hash-field commands: the one the suite runs against when it has
/// `HSETEX`, else the cached 8.2 binary; `None` (the test then says it skipped) without one.
/// Active expiry is turned off (`DEBUG SET-ACTIVE-EXPIRE 0`) so that expired hash fields go
/// only when a command touches them, as in the model without a lag: the replies are then
/// deterministic.
fn redis8_server() -> Option<RedisServer> {
    let args = ["--enable-debug-command", "local"];
    let server = RedisServer::start_with(&args).expect("start redis-server");
    let has_hsetex = |s: &RedisServer| {
        matches!(Real::connect(s.addr()).call(&command(&[b"COMMAND", b"INFO", b"HSETEX"])),
            Value::Array(Some(items)) if matches!(items.first(), Some(Value::Array(Some(_)))))
    };
    let server = if has_hsetex(&server) {
        server
    } else {
        let program = super::local_servers::redis8_program()?;
        RedisServer::start_program(&program, &args).expect("start Redis 8")
    };
    let off = Real::connect(server.addr()).call(&command(&[b"DEBUG", b"SET-ACTIVE-EXPIRE", b"0"]));
    assert_eq!(off, Value::Simple(b"OK".to_vec()));
    Some(server)
}

impl Pair {
    /// Sends one write of several commands (a pipeline, a `MULTI` block) to both and returns
    /// every reply of each.
    fn both_all(&mut self, bytes: &[u8]) -> (Vec<Value>, Vec<Value>) {
        let commands = super::commands(bytes);
        self.real.stream.write_all(bytes).expect("write");
        let real: Vec<Value> = commands.iter().map(|_| self.real.next()).collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as i64;
        let sim = self
            .sim
            .execute_all(now, &commands)
            .iter()
            .map(|r| value(r))
            .collect();
        self.compared += commands.len();
        (real, sim)
    }

    /// Every reply the same, errors by their kind (scripts add where they failed), and a
    /// random field (`HRANDFIELD`) only as present or not.
    fn same_all(&mut self, bytes: &[u8], what: &str) {
        let (real, sim) = self.both_all(bytes);
        assert_eq!(real.len(), sim.len(), "{what}");
        for (r, s) in real.iter().zip(&sim) {
            assert!(
                alike(r, s, bytes.starts_with(b"*1\r\n$5\r\nMULTI")),
                "{what}: redis-server {real:?} against the simulated node {sim:?}"
            );
        }
    }

    /// `HPTTL key FIELDS 1 field`: the same code, or both within a second of each other.
    fn close_field_ttl(&mut self, key: &[u8], field: &[u8]) {
        let (real, sim) = self.both(&command(&[b"HPTTL", key, b"FIELDS", b"1", field]));
        match (&real, &sim) {
            (Value::Array(Some(a)), Value::Array(Some(b))) => match (&a[..], &b[..]) {
                ([Value::Integer(a)], [Value::Integer(b)]) if *a < 0 || *b < 0 => {
                    assert_eq!(a, b)
                }
                ([Value::Integer(a)], [Value::Integer(b)]) => {
                    assert!((a - b).abs() < 1000, "HPTTL {a} against {b}")
                }
                _ => panic!("HPTTL {real:?} against {sim:?}"),
            },
            (a, b) => assert_eq!(a, b, "HPTTL"),
        }
    }
}

/// Two replies alike: equal, errors alike as [`same_error`] has it (in arrays too), and
/// within a transaction's answer, a `HRANDFIELD` field as present on both or neither (Redis
/// picks one at random).
fn alike(real: &Value, sim: &Value, in_multi: bool) -> bool {
    match (real, sim) {
        (Value::Error(a), Value::Error(b)) => same_error(a, b),
        (Value::Array(Some(a)), Value::Array(Some(b))) => {
            a.len() == b.len()
                && a.iter().zip(b).enumerate().all(|(i, (x, y))| match (x, y) {
                    (Value::Bulk(Some(_)), Value::Bulk(Some(_))) if in_multi && i == 0 => true,
                    _ => alike(x, y, false),
                })
        }
        (a, b) => a == b,
    }
}

/// Two error replies alike for the library: of one [`ServerErrorKind`] (from the first word,
/// all it reads of a server's error), and the same text where it reads further: the
/// semaphore's shape mismatch, in its own script's words. Servers word the rest as they
/// like: Valkey answers `NOSCRIPT No matching script.` where Redis adds `Please use EVAL.`,
/// and Redis appends where in a script an error was raised.
fn same_error(real: &[u8], sim: &[u8]) -> bool {
    if real.starts_with(SEM_MISMATCH) || sim.starts_with(SEM_MISMATCH) {
        return real == sim;
    }
    ServerErrorKind::of(real) == ServerErrorKind::of(sim)
}

/// A reply as text, for messages.
fn shown(value: &Value) -> String {
    match value {
        Value::Error(e) => format!("-{}", String::from_utf8_lossy(e)),
        other => format!("{other:?}"),
    }
}

/// The commands a read-write lock sends to a Redis 8 node (readers as hash fields with their
/// own expiry, the writer's `MULTI` block, extends and releases that reach both
/// representations) and the scripts beside them, through the real ops with the node's
/// capabilities, against Redis 8.2: every reply must match; then field expiry.
#[test]
fn native_read_write_commands_answer_like_redis_8() {
    let Some(server) = redis8_server() else {
        eprintln!(
            "native_read_write_commands_answer_like_redis_8: skipped, no Redis 8 redis-server \
             (run `bash .ci/install`, or set {})",
            super::local_servers::REDIS8_SERVER_ENV
        );
        return;
    };
    let native = crate::engine::ops::Caps {
        delex: false,
        hsetex: true,
        sharded: false,
    };
    let encode_for = |op: &dyn Op, form: ScriptForm| {
        let mut out = Vec::new();
        op.encode_for(&mut out, form, native);
        out
    };
    let mut pair = Pair::new(&server);
    let mut rng = Rng::new(0x8a5e);
    let tokens: [&[u8]; 3] = [
        b"0000000000000000000000000000000000000001",
        b"0000000000000000000000000000000000000002",
        b"ffffffffffffffffffffffffffffffffffffffff",
    ];
    let rw = [RwKeys::new(b"doc:a"), RwKeys::new(b"{doc}:b")];
    let mut kinds = [0usize; 12];
    // Long TTLs: nothing expires in this phase.
    for i in 0..600 {
        let token = tokens[rng.below(3) as usize];
        let ids = AttemptIds {
            waiter: tokens[rng.below(3) as usize],
            token,
        };
        let ttl_ms = rng.range(100_000, 200_000);
        let form = if rng.chance(0.5) {
            ScriptForm::Sha
        } else {
            ScriptForm::Body
        };
        let k = &rw[rng.below(2) as usize];
        let kind = rng.below(12) as usize;
        kinds[kind] += 1;
        let read = |native| ReadAcquire {
            keys: k,
            token,
            ttl_ms,
            native,
        };
        let cmd = match kind {
            0 | 1 => encode_for(&read(true), form),
            2 => encode_for(&read(false), form),
            3 | 4 => encode_for(
                &WriteAcquire {
                    keys: k,
                    ids,
                    ttl_ms,
                    intent_ms: 0,
                },
                form,
            ),
            5 => encode_for(
                &ReadExtend {
                    keys: k,
                    token,
                    ttl_ms,
                },
                form,
            ),
            6 => {
                let op = ReadRelease {
                    resource: b"doc",
                    keys: k,
                    token,
                    announce: rng.chance(0.5),
                };
                if rng.chance(0.5) {
                    encode_for(&op, form)
                } else {
                    // As written for a server not known yet: the script, which must remove a
                    // native reader too.
                    let mut out = Vec::new();
                    op.encode_for(&mut out, form, crate::engine::ops::Caps::default());
                    out
                }
            }
            7 => encode_for(
                &WriteExtend {
                    keys: k,
                    token,
                    ttl_ms,
                },
                form,
            ),
            8 => encode_for(
                &WriteRelease {
                    resource: b"doc",
                    keys: k,
                    token,
                },
                form,
            ),
            9 => encode_for(
                &WriteCleanup {
                    resource: b"doc",
                    keys: k,
                    ids,
                    intent_ms: 0,
                },
                form,
            ),
            10 => command(&[b"EXISTS", k.writer(), k.readers()]),
            _ => {
                pair.close_field_ttl(k.writer(), token);
                continue;
            }
        };
        pair.same_all(&cmd, &format!("op {i}: {}", String::from_utf8_lossy(&cmd)));
    }
    assert!(kinds.iter().all(|&n| n > 20), "{kinds:?}");
    // Hash-field expiry, coarsely: 30 ms readers are gone after 300 ms, 60 s ones are not; a
    // hash whose fields all expired still exists until a command touches its fields.
    let k = RwKeys::new(b"exp");
    let (short, long) = (tokens[0], tokens[1]);
    for (key, ttl) in [
        (b"exp:one".as_slice(), 30),
        (k.writer(), 30),
        (k.writer(), 60_000),
    ] {
        let token = if ttl == 30 { short } else { long };
        pair.same_all(
            &command(&[
                b"HSETEX",
                key,
                b"PX",
                ttl.to_string().as_bytes(),
                b"FIELDS",
                b"1",
                token,
                b"1",
            ]),
            "short and long readers",
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    for cmd in [
        command(&[b"EXISTS", b"exp:one"]),
        command(&[b"SET", b"exp:one", b"w", b"NX", b"PX", b"60000"]),
        command(&[b"HRANDFIELD", b"exp:one"]),
        command(&[b"EXISTS", b"exp:one"]),
        command(&[
            b"HPEXPIRE",
            k.writer(),
            b"60000",
            b"FIELDS",
            b"2",
            short,
            long,
        ]),
        command(&[b"HDEL", k.writer(), short, long]),
        command(&[b"HPEXPIRE", k.writer(), b"60000", b"FIELDS", b"1", long]),
        command(&[b"EXISTS", k.writer()]),
    ] {
        pair.same_all(&cmd, &String::from_utf8_lossy(&cmd));
    }
    // A writer after the last reader expired: `HRANDFIELD` clears the hash in the same
    // transaction, and the `SET` goes through.
    pair.same_all(
        &command(&[
            b"HSETEX", b"exp:two", b"PX", b"30", b"FIELDS", b"1", short, b"1",
        ]),
        "reader",
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut block = Vec::new();
    for c in [
        command(&[b"MULTI"]),
        command(&[b"HRANDFIELD", b"exp:two"]),
        command(&[b"SET", b"exp:two", long, b"NX", b"PX", b"60000"]),
        command(&[b"EXISTS", b"exp:two:r"]),
        command(&[b"EXEC"]),
    ] {
        block.extend_from_slice(&c);
    }
    pair.same_all(&block, "a writer after the readers expired");
    pair.same_all(&command(&[b"GET", b"exp:two"]), "the writer's string");
    println!(
        "differential (Redis 8): {} commands compared",
        pair.compared
    );
}

/// The simulated server (`server.rs`) against a real one: the same bytes, one command at a
/// time, on one connection each.
struct ServerPair {
    real: Real,
    sim: super::server::Server,
    session: super::server::Session,
    compared: usize,
    /// Replies that were refusals of writes, or transactions aborted for one.
    refusals: usize,
}

impl ServerPair {
    fn new(server: &RedisServer, version: (u16, u16, u16)) -> ServerPair {
        ServerPair {
            real: Real::connect(server.addr()),
            sim: super::server::Server::new(Node::default(), version, [b'0'; 40]),
            session: super::server::Session::default(),
            compared: 0,
            refusals: 0,
        }
    }

    /// Every command of `bytes` to both, each reply compared as [`alike`] has it.
    fn same_each(&mut self, bytes: &[u8], what: &str) {
        for cmd in super::commands(bytes) {
            let real = self.real.call(cmd);
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970")
                .as_millis() as i64;
            let mut out = Vec::new();
            self.sim.execute(&mut self.session, now, cmd, &mut out);
            let sim = value(&out);
            self.compared += 1;
            if let Value::Error(e) = &real {
                let refused = [&b"READONLY"[..], b"MISCONF", b"OOM", b"EXECABORT"];
                self.refusals += usize::from(refused.iter().any(|r| e.starts_with(r)));
            }
            assert!(
                alike(&real, &sim, cmd.starts_with(b"*1\r\n$4\r\nEXEC")),
                "{what}: {}: redis-server answers {} where the simulated server answers {}",
                String::from_utf8_lossy(&cmd[..cmd.len().min(60)]),
                shown(&real),
                shown(&sim)
            );
        }
    }
}

/// Makes the real server refuse writes as `refusal` says, as `tests/refused_writes.rs` does.
fn refuse(real: &mut Real, refusal: super::server::Refusal, scratch: &std::path::Path) {
    use super::server::Refusal;
    let ok = |v: Value| assert!(!matches!(v, Value::Error(_)), "{v:?}");
    match refusal {
        // Port 1 on loopback: nothing listens, so the node stays a replica that never syncs.
        Refusal::ReadOnly => ok(real.call(&command(&[b"REPLICAOF", b"127.0.0.1", b"1"]))),
        Refusal::Misconf => {
            let dir = scratch.join("misconf");
            std::fs::create_dir_all(&dir).expect("a directory");
            let d = dir.to_str().expect("a path").as_bytes();
            ok(real.call(&command(&[b"CONFIG", b"SET", b"dir", d])));
            ok(real.call(&command(&[b"CONFIG", b"SET", b"save", b"3600 1"])));
            ok(real.call(&command(&[
                b"CONFIG",
                b"SET",
                b"stop-writes-on-bgsave-error",
                b"yes",
            ])));
            std::fs::remove_dir_all(&dir).expect("removed");
            real.call(&command(&[b"BGSAVE"]));
            let failed = (0..200).any(|_| {
                std::thread::sleep(Duration::from_millis(50));
                matches!(real.call(&command(&[b"INFO", b"persistence"])),
                    Value::Bulk(Some(t)) if t.windows(24).any(|w| w == b"rdb_last_bgsave_status:e"))
            });
            assert!(failed, "the background save did not fail");
        }
        Refusal::Oom => {
            ok(real.call(&command(&[
                b"CONFIG",
                b"SET",
                b"maxmemory-policy",
                b"noeviction",
            ])));
            ok(real.call(&command(&[b"CONFIG", b"SET", b"maxmemory", b"1"])));
        }
    }
}

/// A server that refuses writes (`READONLY`, `MISCONF`, `OOM`) answers every command the
/// locks send as Redis 7.0 and 8.2 do: reads and `PUBLISH` run; refused commands answer the
/// refusal, inside `MULTI` when queued (and `EXEC` answers `EXECABORT`); a script runs until
/// its first write, which is refused (under `OOM` only a command that may grow memory, before
/// any write); deletes run under `OOM`, and Redis 7 refuses everything queued in a
/// transaction once out of memory where Redis 8 refuses only what may grow memory.
#[test]
fn refused_writes_answer_like_redis_7_and_8() {
    use super::server::Refusal;
    use crate::engine::ops::{Caps, SCRIPTS};
    let mut programs = vec![(super::local_servers::redis7_program(), (7, 0, 15))];
    match super::local_servers::redis8_program() {
        Some(p) => programs.push((p, (8, 2, 3))),
        None => eprintln!(
            "refused_writes_answer_like_redis_7_and_8: Redis 8 part skipped, no Redis 8 \
             redis-server (run `bash .ci/install`, or set {})",
            super::local_servers::REDIS8_SERVER_ENV
        ),
    }
    let a: &[u8] = b"0000000000000000000000000000000000000001";
    let b: &[u8] = b"0000000000000000000000000000000000000002";
    let rw = RwKeys::new(b"doc");
    let sem = SemKeys::new(b"sem");
    let set: [&[u8]; 2] = [b"m:a", b"m:b"];
    let mut compared = 0;
    for (program, version) in programs {
        let native = version.0 >= 8;
        let caps = Caps {
            delex: false,
            hsetex: native,
            sharded: false,
        };
        let enc = |op: &dyn Op, form| {
            let mut out = Vec::new();
            op.encode_for(&mut out, form, caps);
            out
        };
        for refusal in [Refusal::ReadOnly, Refusal::Misconf, Refusal::Oom] {
            // `dir` is a protected setting; the MISCONF refusal moves it.
            let server =
                RedisServer::start_program(&program, &["--enable-protected-configs", "yes"])
                    .expect("start redis-server");
            let scratch = server.dir().to_path_buf();
            let mut pair = ServerPair::new(&server, version);
            let what = format!("{version:?} {refusal:?}");
            // What the nodes hold before they refuse: a mutex, a writer, readers (a hash
            // field on Redis 8, a sorted-set member), a semaphore holder, a set; the scripts.
            let mut setup = Vec::new();
            for s in SCRIPTS {
                setup.extend(command(&[b"SCRIPT", b"LOAD", s.body.as_bytes()]));
            }
            setup.extend(enc(
                &Acquire {
                    key: b"mx",
                    token: a,
                    ttl_ms: 100_000,
                },
                ScriptForm::Sha,
            ));
            setup.extend(enc(
                &WriteAcquire {
                    keys: &RwKeys::new(b"wr"),
                    ids: AttemptIds {
                        waiter: a,
                        token: a,
                    },
                    ttl_ms: 100_000,
                    intent_ms: 0,
                },
                ScriptForm::Sha,
            ));
            setup.extend(enc(
                &ReadAcquire {
                    keys: &rw,
                    token: a,
                    ttl_ms: 100_000,
                    native,
                },
                ScriptForm::Sha,
            ));
            setup.extend(enc(
                &ReadAcquire {
                    keys: &rw,
                    token: b,
                    ttl_ms: 100_000,
                    native: false,
                },
                ScriptForm::Sha,
            ));
            setup.extend(enc(
                &SemAcquire {
                    keys: &sem,
                    token: a,
                    ttl_ms: 100_000,
                    shape: 2,
                },
                ScriptForm::Sha,
            ));
            setup.extend(enc(
                &AcquireAll {
                    keys: &set,
                    token: a,
                    ttl_ms: 100_000,
                },
                ScriptForm::Sha,
            ));
            pair.same_each(&setup, &format!("{what}: before"));
            refuse(&mut pair.real, refusal, &scratch);
            pair.sim.refusal = Some(refusal);
            let wr = RwKeys::new(b"wr");
            let block = |cmds: &[&[&[u8]]]| {
                let mut out = Vec::new();
                for c in cmds {
                    out.extend(command(c));
                }
                out
            };
            let cases: Vec<(&str, Vec<u8>)> = vec![
                ("GET", command(&[b"GET", b"mx"])),
                ("EXISTS", command(&[b"EXISTS", b"mx", rw.readers()])),
                ("PUBLISH", command(&[b"PUBLISH", b"ch", b"m"])),
                ("SCRIPT LOAD", command(&[b"SCRIPT", b"LOAD", b"return 1"])),
                ("SET", command(&[b"SET", b"free", a, b"NX", b"PX", b"1000"])),
                ("DEL", command(&[b"DEL", b"nothing"])),
                ("ZREM", command(&[b"ZREM", rw.readers(), b"nobody"])),
                ("PEXPIRE", command(&[b"PEXPIRE", b"nothing", b"1000"])),
                (
                    "acquire",
                    enc(
                        &Acquire {
                            key: b"free",
                            token: a,
                            ttl_ms: 1000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "acquire on a held key",
                    enc(
                        &Acquire {
                            key: b"mx",
                            token: b,
                            ttl_ms: 1000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "release of someone else's",
                    enc(
                        &Release {
                            key: b"mx",
                            token: b,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "extend of someone else's",
                    enc(
                        &Extend {
                            key: b"mx",
                            token: b,
                            ttl_ms: 1000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "extend",
                    enc(
                        &Extend {
                            key: b"mx",
                            token: a,
                            ttl_ms: 100_000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "release",
                    enc(
                        &Release {
                            key: b"mx",
                            token: a,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "release with the body",
                    enc(
                        &Release {
                            key: b"mx",
                            token: a,
                        },
                        ScriptForm::Body,
                    ),
                ),
                (
                    "write acquire",
                    enc(
                        &WriteAcquire {
                            keys: &rw,
                            ids: AttemptIds {
                                waiter: b,
                                token: b,
                            },
                            ttl_ms: 1000,
                            intent_ms: 0,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "read acquire",
                    enc(
                        &ReadAcquire {
                            keys: &wr,
                            token: b,
                            ttl_ms: 1000,
                            native,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "read extend",
                    enc(
                        &ReadExtend {
                            keys: &rw,
                            token: a,
                            ttl_ms: 100_000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "write extend",
                    enc(
                        &WriteExtend {
                            keys: &wr,
                            token: a,
                            ttl_ms: 100_000,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "read release",
                    enc(
                        &ReadRelease {
                            resource: b"doc",
                            keys: &rw,
                            token: a,
                            announce: true,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "read release of a scripted reader",
                    enc(
                        &ReadRelease {
                            resource: b"doc",
                            keys: &rw,
                            token: b,
                            announce: true,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "write release",
                    enc(
                        &WriteRelease {
                            resource: b"wr",
                            keys: &wr,
                            token: a,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "semaphore acquire",
                    enc(
                        &SemAcquire {
                            keys: &sem,
                            token: b,
                            ttl_ms: 1000,
                            shape: 2,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "semaphore release",
                    enc(
                        &SemRelease {
                            resource: b"sem",
                            holders: sem.holders(),
                            token: a,
                        },
                        ScriptForm::Sha,
                    ),
                ),
                (
                    "set release",
                    enc(&ReleaseAll::new(&set, a), ScriptForm::Sha),
                ),
                (
                    "a transaction of a delete and a read",
                    block(&[
                        &[b"MULTI"],
                        &[b"DEL", b"nothing"],
                        &[b"GET", b"mx"],
                        &[b"EXEC"],
                    ]),
                ),
                (
                    "a transaction of reads and PUBLISH",
                    block(&[
                        &[b"MULTI"],
                        &[b"GET", b"mx"],
                        &[b"PUBLISH", b"ch", b"m"],
                        &[b"EXEC"],
                    ]),
                ),
                (
                    "a transaction that may grow memory",
                    block(&[&[b"MULTI"], &[b"SET", b"free", a], &[b"EXEC"]]),
                ),
            ];
            for (name, bytes) in cases {
                pair.same_each(&bytes, &format!("{what}: {name}"));
            }
            // Writes were refused, and not all of them: reads, PUBLISH and (out of memory)
            // deletes went through.
            assert!(
                pair.refusals >= 5 && pair.refusals + 10 < pair.compared,
                "{what}: {} refusals in {} replies",
                pair.refusals,
                pair.compared
            );
            println!(
                "{what}: {} of {} replies refused",
                pair.refusals, pair.compared
            );
            compared += pair.compared;
        }
    }
    println!("differential (refused writes): {compared} commands compared");
}

/// A connection's setup as the endpoint writes it, against Redis 7.0 and 8.2: `AUTH` refused
/// without a password and with a wrong one, commands refused before `AUTH`, `SELECT`, and
/// what `INFO server` and `COMMAND INFO DELEX HSETEX` say of the server.
#[test]
fn connection_setups_answer_like_redis_7_and_8() {
    use super::server::Server;
    use crate::engine::endpoint::setup::Server as Learnt;
    let mut programs = vec![(super::local_servers::redis7_program(), (7, 0, 15))];
    if let Some(p) = super::local_servers::redis8_program() {
        programs.push((p, (8, 2, 3)));
    }
    let mut compared = 0;
    for (program, version) in programs {
        for password in [None, Some(&b"sim-secret"[..])] {
            let pw = password.map(|p| String::from_utf8_lossy(p).into_owned());
            let args: Vec<&str> = match &pw {
                Some(p) => vec!["--requirepass", p],
                None => Vec::new(),
            };
            let server = RedisServer::start_program(&program, &args).expect("start redis-server");
            let mut pair = ServerPair::new(&server, version);
            pair.sim.password = password.map(<[u8]>::to_vec);
            let what = format!("{version:?}, password {pw:?}");
            pair.same_each(&command(&[b"AUTH", b"wrong"]), &what);
            pair.same_each(&command(&[b"SCRIPT", b"LOAD", b"return 1"]), &what);
            if let Some(p) = password {
                pair.same_each(&command(&[b"AUTH", p]), &what);
            }
            pair.same_each(&command(&[b"SELECT", b"3"]), &what);
            pair.same_each(&command(&[b"SELECT", b"99"]), &what);
            // The server's identity: the same software and version learnt from both.
            let info = command(&[b"INFO", b"server"]);
            let real = pair.real.call(&info);
            let mut out = Vec::new();
            pair.sim.execute(&mut pair.session, 0, &info, &mut out);
            let learnt = |v: &Value| {
                let mut s = Learnt::default();
                let Value::Bulk(Some(text)) = v else {
                    panic!("INFO: {v:?}")
                };
                s.read_info(text);
                (s.software, s.version, s.run_id.is_some())
            };
            assert_eq!(learnt(&real), learnt(&value(&out)), "{what}");
            // What it offers, byte for byte.
            let caps = command(&[b"COMMAND", b"INFO", b"DELEX", b"HSETEX"]);
            pair.real.stream.write_all(&caps).expect("write");
            let real = pair.real.next();
            let mut out = Vec::new();
            pair.sim.execute(&mut pair.session, 0, &caps, &mut out);
            assert_eq!(real, value(&out), "{what}: COMMAND INFO");
            pair.same_each(
                &command(&[b"HSETEX", b"h", b"PX", b"1000", b"FIELDS", b"1", b"f", b"v"]),
                &what,
            );
            compared += pair.compared + 2;
            let _ = Server::has_hash_fields;
        }
    }
    println!("differential (setups): {compared} commands compared");
}

/// Redis's Lua, as the simulated node runs it: conversions of replies and of a script's value
/// both ways, `redis.call` and `redis.pcall` on errors, `error_reply` and `status_reply`,
/// locked globals, errors raised by the runtime, commands a script may not call, `KEYS` and
/// `ARGV`, `TIME`, the library functions the lock scripts use, and the commands only scripts
/// send. Errors alike by kind (the servers word them differently), everything else exactly.
#[test]
fn lua_runs_like_redis_server() {
    let server = RedisServer::start().expect("start redis-server");
    let mut pair = Pair::new(&server);
    let eval = |body: &str, keys: &[&[u8]], args: &[&[u8]]| {
        let mut cmd = Vec::new();
        let numkeys = keys.len().to_string();
        let mut all: Vec<&[u8]> = vec![b"EVAL", body.as_bytes(), numkeys.as_bytes()];
        all.extend_from_slice(keys);
        all.extend_from_slice(args);
        resp::encode_command(&mut cmd, &all);
        cmd
    };
    pair.same(&command(&[b"SET", b"s", b"v"]), "SET");
    pair.same(
        &command(&[b"ZADD", b"z", b"1", b"a", b"2", b"b", b"3", b"c"]),
        "ZADD",
    );
    for body in [
        // A script's value as a reply.
        "return 3.9",
        "return -3.9",
        "return 2^53",
        "return {1, 2, nil, 4}",
        "return {1, {2, 'x', {}}, false, true, {ok = 'FINE'}}",
        "return true",
        "return false",
        "return nil",
        "return 'text'",
        "return {ok = 'FINE'}",
        "return {err = 'MYCODE my message'}",
        "return redis.status_reply('FINE')",
        "return redis.error_reply('ERR fence counter is not a whole number')",
        "return redis.error_reply('no code')",
        "return redis.error_reply('-WRONGTYPE with a dash')",
        "return redis.error_reply(1, 2)",
        // Replies as a script sees them.
        "return redis.call('get', KEYS[1])",
        "return type(redis.call('get', 'missing'))",
        "return redis.call('get', 'missing') == false",
        "return redis.call('set', 'q', '1').ok",
        "return type(redis.call('set', 'q', '1'))",
        "return redis.call('set', 'q', '1')",
        "return redis.call('zrange', 'z', 0, -1)",
        "return #redis.call('zrange', 'z', 0, -1)",
        "return redis.call('exists', 's', 's', 'z', 'missing')",
        "return redis.call('zscore', 'z', 'b') + 0.5",
        // Errors: returned by pcall, raised by call, and raised by the runtime.
        "return redis.pcall('get', 'z')",
        "return redis.pcall('get', 'z').err",
        "return redis.call('get', 'z')",
        "local ok, e = pcall(redis.call, 'get', 'z'); return {tostring(ok), type(e), e}",
        "local ok, e = pcall(error, {err = 'x'}); return {tostring(ok), type(e), e}",
        "local ok, e = pcall(error, {}); return {tostring(ok), type(e)}",
        "return {pcall(function(a, b) return a, nil, b end, 1, 2)}",
        "return redis.pcall('zadd', 's', 1, 'm')",
        "return redis.call('get', {})",
        "return redis.pcall('get', {})",
        "return redis.call()",
        "return redis.pcall('nosuchcommand')",
        "return redis.call('eval', 'return 1', 0)",
        "return redis.pcall('script', 'load', 'return 1')",
        "return undefined_global",
        "defined_global = 1",
        "return nil + 1",
        "error('boom')",
        "error({err = 'WRONGTYPE raised by the script'})",
        "local function f() return redis.call('get', 'z') end\nreturn f()",
        // KEYS and ARGV, TIME, numbers passed to commands.
        "return {#KEYS, #ARGV, KEYS[1], ARGV[1], ARGV[2]}",
        "local t = redis.call('time'); return {type(t[1]), type(t[2]), #t, tonumber(t[2]) < 1000000}",
        "redis.call('set', 'n', 2^53); return redis.call('get', 'n')",
        "redis.call('set', 'n', -7); return redis.call('get', 'n')",
        "redis.call('zadd', 'zn', 1700000000123 + 30000, 'm'); return redis.call('zscore', 'zn', 'm')",
        // The library functions the lock scripts use.
        "return {tostring(tonumber(' 0x10 ')), tostring(tonumber('1e3')), tostring(tonumber('x'))}",
        "return {string.format('%d', 2^53 - 1), tostring(1e15), tostring(-0.5), tostring(1/3)}",
        "return {math.floor(-2.5), math.floor(7), string.sub('0123456789abcdefXYZ', 1, 16)}",
        "return '(' .. 1700000000123",
        // The commands only scripts send.
        "return {redis.call('zrank', 'z', 'c'), redis.call('zrank', 'z', 'x')}",
        "return {redis.call('zcount', 'z', '(1', '+inf'), redis.call('zcount', 'z', '-inf', '(3')}",
        "return redis.call('zcount', 'z', '(0', '(+inf')",
        "return {redis.call('zadd', 'z', 'XX', 9, 'a'), redis.call('zadd', 'z', 'XX', 9, 'new')}",
        "return {redis.call('zadd', 'z', 'NX', 5, 'a'), redis.call('zadd', 'z', 'NX', 5, 'd')}",
        "return redis.call('zadd', 'z', 'XX', 'CH', 4, 'a', 4, 'b')",
        "return redis.pcall('zadd', 'z', 'XX', 'NX', 1, 'a')",
        "return redis.call('zrange', 'z', 0, -1)",
        "return redis.call('zremrangebyscore', 'z', '(4', 5)",
        "return redis.call('zrangebyscore', 'z', '-inf', '(5')",
    ] {
        pair.same(&eval(body, &[b"s"], &[b"a1", b"a2"]), body);
    }
    // Exclusive bounds outside scripts too.
    pair.same(
        &command(&[b"ZRANGEBYSCORE", b"z", b"(3", b"+inf"]),
        "ZRANGEBYSCORE",
    );
    // A script that does not compile is not cached.
    let broken = eval("return +", &[], &[]);
    pair.same(&broken, "compile error");
    let sha = crate::sha1::sha1_hex(b"return +");
    pair.same(&command(&[b"EVALSHA", &sha, b"0"]), "not cached");
    // The error a script raised names the script and the line, as Redis's does.
    let (real, sim) = pair.both(&eval(
        "local x = 1\nreturn redis.call('get', 'z')",
        &[],
        &[],
    ));
    let sha = crate::sha1::sha1_hex(b"local x = 1\nreturn redis.call('get', 'z')");
    let tail = format!(
        " script: {}, on @user_script:2.",
        String::from_utf8_lossy(&sha)
    );
    for reply in [&real, &sim] {
        assert!(
            matches!(reply, Value::Error(e) if e.starts_with(b"WRONGTYPE") && e.ends_with(tail.as_bytes())),
            "{} against {}",
            shown(&real),
            shown(&sim)
        );
    }
    println!("differential (Lua): {} commands compared", pair.compared);
}

/// Whether `cmd` is one `EVAL` or `EVALSHA`.
fn is_script(cmd: &[u8]) -> bool {
    let name = match resp::decode(cmd, &Limits::default()) {
        Ok(Status::Complete((resp::Reply::Array(Some(items)), _))) => match items.first() {
            Some(resp::Reply::Bulk(Some(name))) => name.to_ascii_uppercase(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    name == b"EVAL" || name == b"EVALSHA"
}

/// `INFO persistence`'s field `name`.
fn persistence(real: &mut Real, name: &str) -> String {
    let Value::Bulk(Some(info)) = real.call(&command(&[b"INFO", b"persistence"])) else {
        panic!("INFO did not answer a bulk string");
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")).map(str::to_owned))
        .unwrap_or_default()
}

/// A node that refuses writes (a read-only replica, one whose background save failed, one over
/// `maxmemory`) refuses its scripts' write commands as Redis does: `redis.call` raises the
/// refusal, reads and `PUBLISH` still run, and over `maxmemory` only commands that add memory
/// are refused, and only until the script's first write went through. Every lock script runs
/// on the same state on both, with the refusal set on the simulated node, and the state must
/// match afterwards.
#[test]
fn scripts_refuse_writes_like_redis_server() {
    let server = RedisServer::start_with(&["--enable-protected-configs", "yes"])
        .expect("start redis-server");
    let mut admin = Real::connect(server.addr());
    let tokens: [&[u8]; 3] = [
        b"0000000000000000000000000000000000000001",
        b"0000000000000000000000000000000000000002",
        b"ffffffffffffffffffffffffffffffffffffffff",
    ];
    let ttl_ms = 100_000;
    let rw = [
        RwKeys::new(b"doc:a"),
        RwKeys::new(b"{doc}:b"),
        RwKeys::new(b"doc:c"),
    ];
    let sem = SemKeys::new(b"sem");
    let fence = fence_key(b"f");
    let writer_fence = fence_key(rw[2].writer());
    let set: [&[u8]; 2] = [b"m:b", b"m:c"];
    let free_set: [&[u8]; 2] = [b"m:d", b"m:e"];
    let ids = |w: usize, t: usize| AttemptIds {
        waiter: tokens[w],
        token: tokens[t],
    };
    let joined = FairState::new(3, ttl_ms, Duration::ZERO);
    joined.on_retry(Duration::ZERO);
    let read = FenceRead::new();
    let ok = Value::Simple(b"OK".to_vec());
    for mode in ["READONLY", "OOM", "MISCONF"] {
        let mut pair = Pair::new(&server);
        pair.same(&command(&[b"FLUSHALL"]), "FLUSHALL");
        // The state: a reader and a writer's intent on doc:a, a writer on {doc}:b, a mutex, a
        // queue behind it, a semaphore holder, a fence counter, a set.
        let setup: Vec<Vec<u8>> = vec![
            encode(
                &ReadAcquire {
                    keys: &rw[0],
                    token: tokens[0],
                    ttl_ms,
                    native: false,
                },
                ScriptForm::Body,
            ),
            encode(
                &WriteAcquire {
                    keys: &rw[0],
                    ids: ids(1, 1),
                    ttl_ms,
                    intent_ms: ttl_ms,
                },
                ScriptForm::Body,
            ),
            encode(
                &WriteAcquire {
                    keys: &rw[1],
                    ids: ids(1, 1),
                    ttl_ms,
                    intent_ms: 0,
                },
                ScriptForm::Body,
            ),
            encode(
                &Acquire {
                    key: b"m:a",
                    token: tokens[0],
                    ttl_ms,
                },
                ScriptForm::Body,
            ),
            encode(
                &FairAcquire::new(b"m:a", ids(2, 2), ttl_ms, &joined),
                ScriptForm::Body,
            ),
            encode(
                &SemAcquire {
                    keys: &sem,
                    token: tokens[0],
                    ttl_ms,
                    shape: 2,
                },
                ScriptForm::Body,
            ),
            encode(
                &FencedAcquire {
                    key: b"f",
                    fence: &fence,
                    token: tokens[0],
                    ttl_ms,
                    read: &read,
                },
                ScriptForm::Body,
            ),
            encode(
                &AcquireAll {
                    keys: &set,
                    token: tokens[2],
                    ttl_ms,
                },
                ScriptForm::Body,
            ),
        ];
        for cmd in &setup {
            pair.same(cmd, "setup");
        }
        // Enter the mode.
        match mode {
            "READONLY" => {
                // A replica of a master that is not there keeps its data and refuses writes.
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("a free port")
                    .port()
                    .to_string();
                let r = admin.call(&command(&[b"REPLICAOF", b"127.0.0.1", port.as_bytes()]));
                assert_eq!(r, ok, "REPLICAOF");
                pair.sim.refusals.read_only = true;
            }
            "OOM" => {
                let r = admin.call(&command(&[b"CONFIG", b"SET", b"maxmemory", b"1"]));
                assert_eq!(r, ok, "CONFIG SET maxmemory");
                pair.sim.refusals.oom = true;
            }
            _ => {
                // A background save into a directory that is gone fails.
                let gone = std::env::temp_dir().join(format!(
                    "redlock-mux-misconf-{}-{}",
                    std::process::id(),
                    server.addr().port()
                ));
                std::fs::create_dir_all(&gone).expect("a directory");
                let path = gone.to_string_lossy().into_owned();
                let r = admin.call(&command(&[b"CONFIG", b"SET", b"dir", path.as_bytes()]));
                assert_eq!(r, ok, "CONFIG SET dir");
                // Writes are refused only where saves are configured.
                let r = admin.call(&command(&[b"CONFIG", b"SET", b"save", b"3600 1"]));
                assert_eq!(r, ok, "CONFIG SET save");
                std::fs::remove_dir(&gone).expect("remove the directory");
                admin.call(&command(&[b"BGSAVE"]));
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while persistence(&mut admin, "rdb_last_bgsave_status") != "err"
                    || persistence(&mut admin, "rdb_bgsave_in_progress") != "0"
                {
                    assert!(std::time::Instant::now() < deadline, "BGSAVE did not fail");
                    std::thread::sleep(Duration::from_millis(20));
                }
                pair.sim.refusals.misconf = true;
            }
        }
        let fair = |w: usize| {
            let fair = FairState::new(5 + w as u64, ttl_ms, Duration::ZERO);
            fair.on_retry(Duration::ZERO);
            fair
        };
        let (f0, f1) = (fair(0), fair(1));
        let ops: Vec<(&str, Vec<u8>)> = vec![
            // Refused before any write: by the writer key, by the intent, by a held key.
            (
                "read acquire, writer holds",
                encode(
                    &ReadAcquire {
                        keys: &rw[1],
                        token: tokens[2],
                        ttl_ms,
                        native: false,
                    },
                    ScriptForm::Sha,
                ),
            ),
            // Prunes intents (a write, allowed over maxmemory), then refused by the live intent.
            (
                "read acquire, intent",
                encode(
                    &ReadAcquire {
                        keys: &rw[0],
                        token: tokens[2],
                        ttl_ms,
                        native: false,
                    },
                    ScriptForm::Sha,
                ),
            ),
            // Adds a reader: ZADD first, refused at once.
            (
                "read acquire, free",
                encode(
                    &ReadAcquire {
                        keys: &rw[2],
                        token: tokens[2],
                        ttl_ms,
                        native: false,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair read acquire",
                encode(
                    &FairRwAcquire::read(&rw[2], ids(0, 0), ttl_ms, &f0),
                    ScriptForm::Sha,
                ),
            ),
            // Prunes readers, then leaves an intent.
            (
                "write acquire, reader",
                encode(
                    &WriteAcquire {
                        keys: &rw[0],
                        ids: ids(2, 2),
                        ttl_ms,
                        intent_ms: ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "write acquire, free",
                encode(
                    &WriteAcquire {
                        keys: &rw[2],
                        ids: ids(2, 2),
                        ttl_ms,
                        intent_ms: 0,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair write acquire",
                encode(
                    &FairRwAcquire::write(&rw[2], ids(1, 1), ttl_ms, ttl_ms, &f1),
                    ScriptForm::Sha,
                ),
            ),
            (
                "fenced write acquire",
                encode(
                    &FencedWriteAcquire {
                        keys: &rw[2],
                        fence: &writer_fence,
                        ids: ids(0, 0),
                        ttl_ms,
                        intent_ms: 0,
                        fair: None,
                        read: &read,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "write cleanup",
                encode(
                    &WriteCleanup {
                        resource: b"doc",
                        keys: &rw[1],
                        ids: ids(1, 1),
                        intent_ms: ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "write release",
                encode(
                    &WriteRelease {
                        resource: b"doc",
                        keys: &rw[1],
                        token: tokens[1],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "reader release",
                encode(
                    &SetRelease {
                        resource: b"doc",
                        set: rw[0].readers(),
                        token: tokens[0],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "read extend",
                encode(
                    &ReadExtend {
                        keys: &rw[0],
                        token: tokens[0],
                        ttl_ms: 2 * ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "downgrade",
                encode(
                    &Downgrade {
                        resource: b"doc",
                        keys: &rw[1],
                        token: tokens[1],
                        ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "downgrade undo",
                encode(
                    &DowngradeUndo {
                        resource: b"doc",
                        keys: &rw[1],
                        token: tokens[1],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "release",
                encode(
                    &Release {
                        key: b"m:a",
                        token: tokens[0],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "release of another's",
                encode(
                    &Release {
                        key: b"m:a",
                        token: tokens[1],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "extend",
                encode(
                    &Extend {
                        key: b"m:a",
                        token: tokens[0],
                        ttl_ms: 2 * ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair acquire, queue",
                encode(
                    &FairAcquire::new(b"m:a", ids(1, 1), ttl_ms, &f1),
                    ScriptForm::Sha,
                ),
            ),
            (
                "leave",
                encode(
                    &Leave {
                        resource: b"m:a",
                        keys: QueueKeys::Mutex(b"m:a"),
                        kind: b"",
                        family: crate::engine::keys::Family::Mutex,
                        waiter: tokens[2],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "semaphore acquire",
                encode(
                    &SemAcquire {
                        keys: &sem,
                        token: tokens[1],
                        ttl_ms,
                        shape: 2,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair semaphore acquire",
                encode(
                    &FairSemAcquire {
                        keys: &sem,
                        ids: ids(2, 2),
                        ttl_ms,
                        shape: 2,
                        fair: &f0,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "semaphore extend",
                encode(
                    &SemExtend {
                        holders: sem.holders(),
                        token: tokens[0],
                        ttl_ms: 2 * ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "semaphore release",
                encode(
                    &SemRelease {
                        resource: b"sem",
                        holders: sem.holders(),
                        token: tokens[0],
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fenced acquire, held",
                encode(
                    &FencedAcquire {
                        key: b"f",
                        fence: &fence,
                        token: tokens[1],
                        ttl_ms,
                        read: &read,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fenced acquire, free",
                encode(
                    &FencedAcquire {
                        key: b"g",
                        fence: &fence_key(b"g"),
                        token: tokens[1],
                        ttl_ms,
                        read: &read,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair fenced acquire",
                encode(
                    &FairFencedAcquire {
                        key: b"f",
                        fence: &fence,
                        ids: ids(1, 1),
                        ttl_ms,
                        fair: &f1,
                        read: &read,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fence write",
                encode(
                    &FenceWrite {
                        key: b"f",
                        fence: &fence,
                        token: tokens[0],
                        value: 40,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "acquire all, held",
                encode(
                    &AcquireAll {
                        keys: &set,
                        token: tokens[0],
                        ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "acquire all, free",
                encode(
                    &AcquireAll {
                        keys: &free_set,
                        token: tokens[0],
                        ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "fair acquire all",
                encode(
                    &FairAcquireAll {
                        keys: &free_set,
                        ids: ids(0, 0),
                        ttl_ms,
                        fair: &f0,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "extend all",
                encode(
                    &ExtendAll {
                        keys: &set,
                        token: tokens[2],
                        ttl_ms: 2 * ttl_ms,
                    },
                    ScriptForm::Sha,
                ),
            ),
            (
                "release all",
                encode(&ReleaseAll::new(&set, tokens[2]), ScriptForm::Sha),
            ),
        ];
        for (what, cmd) in &ops {
            assert!(is_script(cmd), "{what}: not a script");
            pair.same(cmd, &format!("{mode}: {what}"));
        }
        // The same state on both.
        let keys: Vec<&[u8]> = vec![
            rw[0].writer(),
            rw[0].readers(),
            rw[0].intents(),
            rw[1].writer(),
            rw[1].readers(),
            rw[1].intents(),
            rw[2].writer(),
            rw[2].readers(),
            rw[2].intents(),
            b"m:a",
            b"f",
            b"g",
            &fence,
            set[0],
            set[1],
            free_set[0],
            free_set[1],
        ];
        for key in keys {
            pair.same(&command(&[b"EXISTS", key]), &format!("{mode}: EXISTS"));
        }
        for (key, member) in [(rw[0].readers(), tokens[0]), (rw[0].intents(), tokens[1])] {
            pair.close_score(key, member);
        }
        pair.same(&command(&[b"GET", &fence]), &format!("{mode}: fence"));
        pair.same(
            &command(&[b"ZRANGE", sem.holders(), b"0", b"-1"]),
            &format!("{mode}: holders"),
        );
        pair.same(
            &command(&[b"ZRANGE", &queue_key(b"m:a"), b"0", b"-1"]),
            &format!("{mode}: queue"),
        );
        // Leave the mode.
        let back = match mode {
            "READONLY" => admin.call(&command(&[b"REPLICAOF", b"NO", b"ONE"])),
            "OOM" => admin.call(&command(&[b"CONFIG", b"SET", b"maxmemory", b"0"])),
            _ => admin.call(&command(&[b"CONFIG", b"SET", b"save", b""])),
        };
        assert_eq!(back, ok, "{mode}: leaving the mode");
        println!("differential ({mode}): {} commands compared", pair.compared);
    }
}

/// A `ROLE` reply with its replication offsets set to 0 (the simulation's): what the rest
/// says must match.
fn without_offsets(v: &Value) -> Value {
    let Value::Array(Some(items)) = v else {
        return v.clone();
    };
    let mut items = items.clone();
    match items.first() {
        Some(Value::Bulk(Some(r))) if r.as_slice() == b"master" => {
            items[1] = Value::Integer(0);
            if let Some(Value::Array(Some(replicas))) = items.get_mut(2) {
                for r in replicas {
                    if let Value::Array(Some(f)) = r {
                        f[2] = Value::Bulk(Some(b"0".to_vec()));
                    }
                }
            }
        }
        Some(Value::Bulk(Some(r))) if r.as_slice() == b"slave" => items[4] = Value::Integer(0),
        _ => {}
    }
    Value::Array(Some(items))
}

/// What the simulated Sentinel members answer beyond the data (see `sentinel.rs`) against a
/// real master, its replica and three `redis-server --sentinel`: `ROLE` on each, `WAIT`,
/// `READONLY` on the replica, `SENTINEL get-master-addr-by-name` for the service and for
/// one unknown, and the `+switch-master` message of a failover.
#[test]
fn sentinel_replies_answer_like_redis_sentinel() {
    use super::sentinel as sim;
    use redlock_mux_kit::sentinel::SentinelMember;
    let member = SentinelMember::start(None).expect("a master, a replica, three sentinels");
    let (master, replica) = (&member.servers[0], &member.servers[1]);
    let (mp, rp) = (master.port(), replica.port());
    let mut m = Real::connect(master.addr());
    let mut r = Real::connect(replica.addr());
    let role = command(&[b"ROLE"]);
    assert_eq!(
        without_offsets(&m.call(&role)),
        value(&sim::role_master(&[rp])),
        "ROLE on the master"
    );
    assert_eq!(
        without_offsets(&r.call(&role)),
        value(&sim::role_replica(mp)),
        "ROLE on the replica"
    );
    assert_eq!(
        m.call(&command(&[b"SET", b"k", b"v"])),
        Value::Simple(b"OK".to_vec())
    );
    assert_eq!(
        m.call(&command(&[b"WAIT", b"1", b"1000"])),
        Value::Integer(1),
        "WAIT on the master"
    );
    let wait = r.call(&command(&[b"WAIT", b"1", b"10"]));
    // Valkey words it without "since Redis 4.0": the kind is what the library reads.
    assert!(
        alike(&wait, &value(sim::WAIT_ON_REPLICA), false),
        "WAIT on the replica: {}",
        shown(&wait)
    );
    let refused = r.call(&command(&[b"SET", b"k", b"w"]));
    let Value::Error(e) = &refused else {
        panic!("a write on the replica: {refused:?}");
    };
    assert_eq!(
        String::from_utf8_lossy(e),
        String::from_utf8_lossy(super::server::Refusal::ReadOnly.message()),
        "READONLY on the replica"
    );
    let svc = member.service.as_bytes();
    for s in &member.sentinels {
        let mut c = Real::connect(s.addr());
        let ask = command(&[b"SENTINEL", b"get-master-addr-by-name", svc]);
        assert_eq!(
            c.call(&ask),
            value(&sim::master_addr(Some(mp))),
            "the master"
        );
        let unknown = command(&[b"SENTINEL", b"get-master-addr-by-name", b"no-such"]);
        assert_eq!(c.call(&unknown), value(&sim::master_addr(None)), "unknown");
    }
    // A failover: the message every subscriber of a sentinel hears.
    let mut sub = Real::connect(member.sentinels[0].addr());
    sub.stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let confirm = sub.call(&command(&[b"SUBSCRIBE", b"+switch-master"]));
    let mut out = Vec::new();
    super::server::subscription_reply(&mut out, b"subscribe", b"+switch-master", 1);
    assert_eq!(confirm, value(&out), "SUBSCRIBE on a sentinel");
    let mut admin = Real::connect(member.sentinels[1].addr());
    assert_eq!(
        admin.call(&command(&[b"SENTINEL", b"FAILOVER", svc])),
        Value::Simple(b"OK".to_vec())
    );
    let message = sub.next();
    let payload = sim::switch_payload(&member.service, mp, rp);
    assert_eq!(
        message,
        value(&super::message_push(
            b"+switch-master",
            payload.as_bytes(),
            false
        )),
        "+switch-master"
    );
    println!("differential (Sentinel): ROLE, WAIT, READONLY, SENTINEL, +switch-master alike");
}
