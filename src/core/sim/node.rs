//! A simulated Redis node: strings and sorted sets with millisecond expiry, a script cache, and
//! the lock scripts' semantics written in Rust.
//!
//! It reads real RESP commands (the bytes `Op::encode` writes) and answers with real RESP
//! replies, so the simulation runs the client's own encode and classify code. Only what the
//! lock algorithms send is modelled; `diff.rs` checks it against a real `redis-server`.
//!
//! To model a new script, write its semantics as a [`ScriptFn`] over the node's primitives and
//! add it to [`SCRIPT_MODELS`]; a test fails while any entry of `ops::SCRIPTS` has no model.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::ops::{Script, EXTEND, RELEASE};
use crate::resp::{self, Limits, Reply, Status, Value};
use crate::sha1::sha1_hex;

/// A script's semantics: `(node, KEYS, ARGV) -> reply`. Errors are error replies, as a Lua
/// error raised by `redis.call` would be.
pub(crate) type ScriptFn = fn(&mut Node, &[&[u8]], &[&[u8]]) -> Value;

/// Every script the simulation knows, by digest.
pub(crate) static SCRIPT_MODELS: &[(&Script, ScriptFn)] =
    &[(&RELEASE, release_script), (&EXTEND, extend_script)];

/// `if get(K) == token then del(K); publish(channel, '1'); return 1 else return 0 end`
fn release_script(node: &mut Node, keys: &[&[u8]], args: &[&[u8]]) -> Value {
    let (Some(key), Some(token), Some(channel)) = (keys.first(), args.first(), args.get(1)) else {
        return script_error("release: KEYS[1], ARGV[1] and ARGV[2] are required");
    };
    match node.get(key) {
        Err(e) => e,
        Ok(Some(v)) if v == *token => {
            node.del(key);
            node.publish(channel);
            Value::Integer(1)
        }
        Ok(_) => Value::Integer(0),
    }
}

/// `if get(K) == token then return pexpire(K, ttl) else return 0 end`
fn extend_script(node: &mut Node, keys: &[&[u8]], args: &[&[u8]]) -> Value {
    let (Some(key), Some(token), Some(ttl)) = (keys.first(), args.first(), args.get(1)) else {
        return script_error("extend: KEYS[1], ARGV[1] and ARGV[2] are required");
    };
    match node.get(key) {
        Err(e) => e,
        Ok(Some(v)) if v == *token => node.pexpire(key, ttl),
        Ok(_) => Value::Integer(0),
    }
}

fn script_error(what: &str) -> Value {
    Value::Error(format!("ERR simulated script: {what}").into_bytes())
}

fn err(message: &str) -> Value {
    Value::Error(message.as_bytes().to_vec())
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

/// What a key holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    /// A string.
    Str(Vec<u8>),
    /// A sorted set: member to score.
    ZSet(BTreeMap<Vec<u8>, f64>),
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    data: Data,
    /// Absolute expiry on this node's clock, in ms; the key is gone once `now > expire_at`.
    expire_at: Option<i64>,
}

/// One simulated Redis node's memory. Crashing it is dropping it.
#[derive(Debug, Default)]
pub(crate) struct Node {
    data: BTreeMap<Vec<u8>, Entry>,
    scripts: BTreeSet<[u8; 40]>,
    /// This node's wall clock in ms, set by the caller before each command.
    now: i64,
    /// Messages published (release announcements).
    pub published: u64,
}

impl Node {
    /// Executes one RESP command (an array of bulk strings) at node time `now_ms`, and returns
    /// the RESP reply.
    pub fn execute(&mut self, now_ms: i64, command: &[u8]) -> Vec<u8> {
        self.now = now_ms;
        let reply = match resp::decode(command, &Limits::default()) {
            Ok(Status::Complete((Reply::Array(Some(items)), used))) if used == command.len() => {
                let args: Option<Vec<&[u8]>> = items
                    .iter()
                    .map(|r| match r {
                        Reply::Bulk(Some(b)) => Some(*b),
                        _ => None,
                    })
                    .collect();
                match args {
                    Some(args) if !args.is_empty() => self.dispatch(&args),
                    _ => err("ERR Protocol error: expected an array of bulk strings"),
                }
            }
            _ => err("ERR Protocol error: not one complete command"),
        };
        let mut out = Vec::new();
        reply.encode(&mut out);
        out
    }

    /// The keys that hold something now (expired ones are not counted).
    pub fn live_keys(&mut self) -> usize {
        let now = self.now;
        self.data
            .retain(|_, e| e.expire_at.is_none_or(|at| now <= at));
        self.data.len()
    }

    fn dispatch(&mut self, args: &[&[u8]]) -> Value {
        let name = args[0].to_ascii_uppercase();
        let rest = &args[1..];
        let arity = |n: usize| -> Result<(), Value> {
            if rest.len() == n {
                Ok(())
            } else {
                Err(Value::Error(
                    format!(
                        "ERR wrong number of arguments for '{}' command",
                        String::from_utf8_lossy(args[0]).to_ascii_lowercase()
                    )
                    .into_bytes(),
                ))
            }
        };
        let r = match name.as_slice() {
            b"SET" if rest.len() >= 2 => Ok(self.set_command(rest)),
            b"GET" => arity(1).map(|()| match self.get(rest[0]) {
                Ok(v) => Value::Bulk(v.map(<[u8]>::to_vec)),
                Err(e) => e,
            }),
            b"DEL" if !rest.is_empty() => Ok(Value::Integer(
                rest.iter().filter(|k| self.del(k)).count() as i64,
            )),
            b"EXISTS" if !rest.is_empty() => Ok(Value::Integer(
                rest.iter().filter(|k| self.entry(k).is_some()).count() as i64,
            )),
            b"PEXPIRE" => arity(2).map(|()| self.pexpire(rest[0], rest[1])),
            b"PTTL" => arity(1).map(|()| self.pttl(rest[0])),
            b"PUBLISH" => arity(2).map(|()| {
                self.publish(rest[0]);
                Value::Integer(0)
            }),
            b"ZADD" if rest.len() >= 3 && rest.len() % 2 == 1 => Ok(self.zadd(rest)),
            b"ZREM" if rest.len() >= 2 => Ok(self.zrem(rest[0], &rest[1..])),
            b"ZCARD" => arity(1).map(|()| match self.zset(rest[0]) {
                Ok(z) => Value::Integer(z.map_or(0, |z| z.len() as i64)),
                Err(e) => e,
            }),
            b"EVAL" | b"EVALSHA" if rest.len() >= 2 => Ok(self.eval(name == b"EVAL", rest)),
            b"SCRIPT" if rest.len() == 2 && rest[0].eq_ignore_ascii_case(b"LOAD") => {
                let sha = sha1_hex(rest[1]);
                self.scripts.insert(sha);
                Ok(Value::Bulk(Some(sha.to_vec())))
            }
            b"FLUSHALL" => {
                self.data.clear();
                Ok(Value::Simple(b"OK".to_vec()))
            }
            b"SET" | b"DEL" | b"EXISTS" | b"ZADD" | b"ZREM" | b"EVAL" | b"EVALSHA" => {
                arity(usize::MAX).map(|()| Value::Integer(0))
            }
            _ => Ok(Value::Error(
                format!(
                    "ERR unknown command '{}' in the simulated node",
                    String::from_utf8_lossy(args[0])
                )
                .into_bytes(),
            )),
        };
        r.unwrap_or_else(|e| e)
    }

    /// `SET key value [NX|XX] [PX ms|EX s]`
    fn set_command(&mut self, args: &[&[u8]]) -> Value {
        let (key, value) = (args[0], args[1]);
        let (mut nx, mut xx, mut px) = (false, false, None);
        let mut i = 2;
        while i < args.len() {
            let opt = args[i].to_ascii_uppercase();
            match opt.as_slice() {
                b"NX" if !xx => nx = true,
                b"XX" if !nx => xx = true,
                b"PX" | b"EX" if px.is_none() && i + 1 < args.len() => {
                    i += 1;
                    let Some(n) = parse_i64(args[i]) else {
                        return err(NOT_INTEGER);
                    };
                    let ms = if opt == b"EX" {
                        n.checked_mul(1000)
                    } else {
                        Some(n)
                    };
                    match ms.filter(|&ms| ms > 0) {
                        Some(ms) => px = Some(ms),
                        None => return err("ERR invalid expire time in 'set' command"),
                    }
                }
                _ => return err("ERR syntax error"),
            }
            i += 1;
        }
        let exists = self.entry(key).is_some();
        if (nx && exists) || (xx && !exists) {
            return Value::Bulk(None);
        }
        self.data.insert(
            key.to_vec(),
            Entry {
                data: Data::Str(value.to_vec()),
                expire_at: px.map(|ms| self.now.saturating_add(ms)),
            },
        );
        Value::Simple(b"OK".to_vec())
    }

    fn eval(&mut self, by_body: bool, args: &[&[u8]]) -> Value {
        let sha = if by_body {
            let sha = sha1_hex(args[0]);
            // Redis 7.0 caches the body of every EVAL, so a later EVALSHA finds it.
            self.scripts.insert(sha);
            sha
        } else {
            let mut sha = [0u8; 40];
            if args[0].len() == 40 {
                sha.copy_from_slice(&args[0].to_ascii_lowercase());
            }
            if !self.scripts.contains(&sha) {
                return err("NOSCRIPT No matching script. Please use EVAL.");
            }
            sha
        };
        let Some(numkeys) = parse_i64(args[1]) else {
            return err(NOT_INTEGER);
        };
        let rest = &args[2..];
        let Some(numkeys) = usize::try_from(numkeys).ok().filter(|&n| n <= rest.len()) else {
            return err(if numkeys < 0 {
                "ERR Number of keys can't be negative"
            } else {
                "ERR Number of keys can't be greater than number of args"
            });
        };
        let Some((_, model)) = SCRIPT_MODELS.iter().find(|(s, _)| s.sha == sha) else {
            return script_error("no model for this script");
        };
        model(self, &rest[..numkeys], &rest[numkeys..])
    }

    /// The live entry at `key`, dropping it first if it has expired.
    fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now;
        if self
            .data
            .get(key)
            .is_some_and(|e| e.expire_at.is_some_and(|at| now > at))
        {
            self.data.remove(key);
        }
        self.data.get_mut(key)
    }

    /// `GET`: the string at `key`, or a WRONGTYPE error reply.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<&[u8]>, Value> {
        match self.entry(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::Str(v), ..
            }) => Ok(Some(v)),
            Some(_) => Err(err(WRONGTYPE)),
        }
    }

    /// `DEL` of one key: whether it existed.
    pub fn del(&mut self, key: &[u8]) -> bool {
        self.entry(key).is_some() && self.data.remove(key).is_some()
    }

    /// `PEXPIRE key ms`: 1 if the key exists (a non-positive TTL deletes it), else 0.
    pub fn pexpire(&mut self, key: &[u8], ms: &[u8]) -> Value {
        let Some(ms) = parse_i64(ms) else {
            return err(NOT_INTEGER);
        };
        let now = self.now;
        match self.entry(key) {
            None => Value::Integer(0),
            Some(_) if ms <= 0 => {
                self.data.remove(key);
                Value::Integer(1)
            }
            Some(e) => {
                e.expire_at = Some(now.saturating_add(ms));
                Value::Integer(1)
            }
        }
    }

    /// `PTTL key`: -2 if missing, -1 without expiry, else the ms left.
    pub fn pttl(&mut self, key: &[u8]) -> Value {
        let now = self.now;
        Value::Integer(match self.entry(key) {
            None => -2,
            Some(Entry {
                expire_at: None, ..
            }) => -1,
            Some(Entry {
                expire_at: Some(at),
                ..
            }) => (*at - now).max(0),
        })
    }

    /// `PUBLISH`: counted only; the simulation has no subscribers.
    pub fn publish(&mut self, _channel: &[u8]) {
        self.published += 1;
    }

    /// The sorted set at `key` (`None` if missing), or a WRONGTYPE error reply.
    pub fn zset(&mut self, key: &[u8]) -> Result<Option<&mut BTreeMap<Vec<u8>, f64>>, Value> {
        match self.entry(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::ZSet(z),
                ..
            }) => Ok(Some(z)),
            Some(_) => Err(err(WRONGTYPE)),
        }
    }

    /// `ZADD key score member [score member ...]`: members newly added.
    pub fn zadd(&mut self, args: &[&[u8]]) -> Value {
        let key = args[0];
        let mut pairs = Vec::new();
        for p in args[1..].chunks(2) {
            match std::str::from_utf8(p[0])
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
            {
                Some(score) if !score.is_nan() => pairs.push((score, p[1])),
                _ => return err("ERR value is not a valid float"),
            }
        }
        if let Err(e) = self.zset(key) {
            return e;
        }
        let entry = self.data.entry(key.to_vec()).or_insert(Entry {
            data: Data::ZSet(BTreeMap::new()),
            expire_at: None,
        });
        let Data::ZSet(z) = &mut entry.data else {
            return err(WRONGTYPE);
        };
        let added = pairs
            .into_iter()
            .filter(|(score, member)| z.insert(member.to_vec(), *score).is_none())
            .count();
        Value::Integer(added as i64)
    }

    /// `ZREM key member...`: members removed; an emptied set is deleted, as in Redis.
    pub fn zrem(&mut self, key: &[u8], members: &[&[u8]]) -> Value {
        let removed = match self.zset(key) {
            Err(e) => return e,
            Ok(None) => 0,
            Ok(Some(z)) => members.iter().filter(|m| z.remove(**m).is_some()).count(),
        };
        if matches!(self.zset(key), Ok(Some(z)) if z.is_empty()) {
            self.data.remove(key);
        }
        Value::Integer(removed as i64)
    }
}

fn parse_i64(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    // Redis accepts no sign but '-', no leading zeros, and no spaces.
    if s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s.starts_with("-0") {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ops::{self, Acquire, Extend, Op, Release, ScriptForm};

    fn run(node: &mut Node, now: i64, op: &dyn Op, form: ScriptForm) -> Value {
        let mut cmd = Vec::new();
        op.encode(&mut cmd, form);
        let out = node.execute(now, &cmd);
        match resp::decode(&out, &Limits::default()) {
            Ok(Status::Complete((r, n))) if n == out.len() => r.to_value(),
            other => panic!("bad reply {other:?}"),
        }
    }

    #[test]
    fn every_script_the_client_loads_has_a_model() {
        for script in ops::SCRIPTS {
            assert!(
                SCRIPT_MODELS.iter().any(|(s, _)| s.sha == script.sha),
                "no simulated model for script {}",
                script.body
            );
        }
    }

    #[test]
    fn lock_ops_with_expiry_and_script_cache() {
        let mut n = Node::default();
        let acq = |token: &'static [u8]| Acquire {
            key: b"k",
            token,
            ttl_ms: 100,
        };
        let ok = Value::Simple(b"OK".to_vec());
        assert_eq!(run(&mut n, 1000, &acq(b"a"), ScriptForm::Sha), ok);
        assert_eq!(
            run(&mut n, 1050, &acq(b"b"), ScriptForm::Sha),
            Value::Bulk(None)
        );
        assert_eq!(
            run(&mut n, 1100, &acq(b"b"), ScriptForm::Sha),
            Value::Bulk(None)
        );
        assert_eq!(
            run(&mut n, 1101, &acq(b"b"), ScriptForm::Sha),
            ok,
            "expired"
        );
        let rel = Release {
            key: b"k",
            token: b"b",
        };
        assert!(matches!(
            run(&mut n, 1102, &rel, ScriptForm::Sha),
            Value::Error(e) if e.starts_with(b"NOSCRIPT")
        ));
        let ext = Extend {
            key: b"k",
            token: b"b",
            ttl_ms: 500,
        };
        assert_eq!(run(&mut n, 1102, &ext, ScriptForm::Body), Value::Integer(1));
        assert_eq!(n.pttl(b"k"), Value::Integer(500));
        // EVAL cached EXTEND only: RELEASE by digest is still unknown.
        assert!(matches!(
            run(&mut n, 1103, &rel, ScriptForm::Sha),
            Value::Error(e) if e.starts_with(b"NOSCRIPT")
        ));
        assert_eq!(run(&mut n, 1103, &rel, ScriptForm::Body), Value::Integer(1));
        assert_eq!(run(&mut n, 1103, &rel, ScriptForm::Sha), Value::Integer(0));
        assert_eq!(n.published, 1);
        assert_eq!(n.live_keys(), 0);
    }
}
