//! A simulated Redis node: strings, sorted sets and hashes with millisecond expiry (per key,
//! and per hash field as Redis 8 has it), `MULTI`/`EXEC`, a script cache, and the lock scripts
//! run from their own Lua source (`lua.rs`).
//!
//! Hash fields expire as in Redis 8.2: reads (`HPTTL`) skip an expired field, `HRANDFIELD`
//! deletes every expired field (and the hash, if none is left), `HPEXPIRE` and `HDEL` act on an
//! expired field that is still there as on a live one, and a hash whose fields all expired
//! still exists for key-level commands (`EXISTS`, `SET NX`, `GET`'s `WRONGTYPE`) until a
//! command deletes its fields or the server's expiry cycle removes it:
//! [`Node::hash_expiry_lag`] ms after its last field expired (never, when `None`, as a server
//! with active expiry turned off).
//!
//! It reads real RESP commands (the bytes `Op::encode` writes) and answers with real RESP
//! replies, so the simulation runs the client's own encode and classify code. Only what the
//! lock algorithms send, and what their scripts call, is modelled; `diff.rs` checks it against
//! a real `redis-server`.

mod lua;

use std::collections::{BTreeMap, BTreeSet};

use crate::resp::{self, Limits, Reply, Status, Value};

pub(crate) use lua::Refusals;

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
    /// A hash: field to value and the field's own expiry (absolute ms on the node's clock; the
    /// field is gone once `now > at`).
    Hash(Fields),
}

/// A hash's fields: field to value and expiry.
type Fields = BTreeMap<Vec<u8>, (Vec<u8>, Option<i64>)>;

/// Whether a hash field with expiry `at` has expired at `now`.
fn field_expired(at: Option<i64>, now: i64) -> bool {
    at.is_some_and(|at| now > at)
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    data: Data,
    /// Absolute expiry on this node's clock, in ms; the key is gone once `now > expire_at`.
    expire_at: Option<i64>,
}

/// One simulated Redis node's memory. Crashing it is dropping it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Node {
    data: BTreeMap<Vec<u8>, Entry>,
    scripts: BTreeSet<[u8; 40]>,
    /// What this node refuses to the write commands of its scripts (see [`Refusals`]).
    pub refusals: Refusals,
    /// This node's wall clock in ms, set by the caller before each command.
    now: i64,
    /// Messages published (release announcements).
    pub published: u64,
    /// The messages published and not yet taken by the simulated network: channel, message.
    /// `true` for a sharded message (`SPUBLISH`).
    pub outbox: Vec<(Vec<u8>, Vec<u8>, bool)>,
    /// How long after its last field expired the expiry cycle deletes a hash nobody touched;
    /// `None`: never (active expiry off).
    pub hash_expiry_lag: Option<i64>,
    /// When set, the first score each member was given in each sorted set (key, member): what
    /// every fair waiter queued with, as this node saw it.
    pub first_scores: Option<FirstScores>,
}

/// The first score of each member of each sorted set: (key, member) to score.
pub(crate) type FirstScores = BTreeMap<(Vec<u8>, Vec<u8>), f64>;

impl Node {
    /// Executes one RESP command (an array of bulk strings) at node time `now_ms`, and returns
    /// the RESP reply.
    pub fn execute(&mut self, now_ms: i64, command: &[u8]) -> Vec<u8> {
        self.now = now_ms;
        let mut out = Vec::new();
        self.run(command).encode(&mut out);
        out
    }

    /// Executes the commands of one write, in order and with nothing in between (as one
    /// client's pipeline reaches a real server: `MULTI` ... `EXEC` runs at once), at node time
    /// `now_ms`, and returns each reply. `MULTI` queues what follows (answering `QUEUED`) until
    /// `EXEC`, which answers with the array of their replies.
    pub fn execute_all(&mut self, now_ms: i64, commands: &[&[u8]]) -> Vec<Vec<u8>> {
        self.now = now_ms;
        let mut queued: Option<Vec<&[u8]>> = None;
        commands
            .iter()
            .map(|&command| {
                let name = command_name(command);
                let reply = match (&mut queued, name.as_slice()) {
                    (None, b"MULTI") => {
                        queued = Some(Vec::new());
                        Value::Simple(b"OK".to_vec())
                    }
                    (Some(_), b"MULTI") => err("ERR MULTI calls can not be nested"),
                    (None, b"EXEC") => err("ERR EXEC without MULTI"),
                    (Some(_), b"EXEC") => {
                        let batch = queued.take().unwrap_or_default();
                        Value::Array(Some(batch.into_iter().map(|c| self.run(c)).collect()))
                    }
                    (Some(batch), _) => {
                        batch.push(command);
                        Value::Simple(b"QUEUED".to_vec())
                    }
                    (None, _) => self.run(command),
                };
                let mut out = Vec::new();
                reply.encode(&mut out);
                out
            })
            .collect()
    }

    /// Decodes and runs one command.
    fn run(&mut self, command: &[u8]) -> Value {
        match resp::decode(command, &Limits::default()) {
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
        }
    }

    /// A restart that reloads the data from disk: only the script cache is lost.
    pub fn forget_scripts(&mut self) {
        self.scripts.clear();
    }

    /// Whether `key` holds something at `now_ms`.
    pub fn has_key(&mut self, now_ms: i64, key: &[u8]) -> bool {
        self.now = now_ms;
        self.entry(key).is_some()
    }

    /// Takes out the keys live at `now_ms` whose names `pick` picks, with their data and
    /// expiry (as `MIGRATE` moves keys to another node of a cluster, which shares this one's
    /// clock).
    pub fn take_keys(
        &mut self,
        now_ms: i64,
        pick: impl Fn(&[u8]) -> bool,
    ) -> Vec<(Vec<u8>, Entry)> {
        self.now = now_ms;
        self.live_keys();
        let names: Vec<Vec<u8>> = self.data.keys().filter(|k| pick(k)).cloned().collect();
        names
            .into_iter()
            .filter_map(|k| self.data.remove(&k).map(|e| (k, e)))
            .collect()
    }

    /// Puts keys taken out of another node in, replacing any of the same name.
    pub fn put_keys(&mut self, keys: Vec<(Vec<u8>, Entry)>) {
        self.data.extend(keys);
    }

    /// What a replica of this node holds once it has every write so far: the data, without
    /// the script cache (scripts reach a replica as their effects) or what is still to publish.
    pub fn replica(&self) -> Node {
        Node {
            data: self.data.clone(),
            scripts: BTreeSet::new(),
            refusals: Refusals::default(),
            now: self.now,
            published: 0,
            outbox: Vec::new(),
            hash_expiry_lag: self.hash_expiry_lag,
            first_scores: None,
        }
    }

    /// Drops what expired by `now_ms`.
    pub fn live_keys_at(&mut self, now_ms: i64) {
        self.now = now_ms;
        self.live_keys();
    }

    /// Whether it holds what `other` holds, key for key.
    pub fn same_data(&self, other: &Node) -> bool {
        self.data == other.data
    }

    /// Whether some key holds a hash: a Redis 7 server cannot load this data (hash fields with
    /// their own expiry are a Redis 8 encoding).
    pub fn has_hashes(&self) -> bool {
        self.data.values().any(|e| matches!(e.data, Data::Hash(_)))
    }

    /// Whether the key `key` holds `token` live: as its string value (followed by a one-slot
    /// semaphore's mark, or not), as a hash field that has
    /// not expired, or as a member of a sorted set scored by an expiry still ahead (a reader,
    /// a semaphore holder).
    pub fn holds_token(&mut self, now_ms: i64, key: &[u8], token: &[u8]) -> bool {
        self.now = now_ms;
        let now = now_ms;
        match self.entry(key).map(|e| &e.data) {
            // A one-slot semaphore's key holds the token followed by its mark.
            Some(Data::Str(v)) => {
                v == token
                    || v.strip_prefix(token)
                        .is_some_and(|mark| mark.starts_with(b":sem:"))
            }
            Some(Data::Hash(h)) => h.get(token).is_some_and(|(_, at)| !field_expired(*at, now)),
            Some(Data::ZSet(z)) => z.get(token).is_some_and(|s| *s > now as f64),
            None => false,
        }
    }

    /// The members of the fair queue `queue` whose entries in `expiries` are live at `now_ms`,
    /// with their tickets.
    pub fn queue_entries(
        &mut self,
        now_ms: i64,
        queue: &[u8],
        expiries: &[u8],
    ) -> Vec<(Vec<u8>, f64)> {
        self.now = now_ms;
        let live: Vec<Vec<u8>> = match self.entry(expiries).map(|e| &e.data) {
            Some(Data::ZSet(z)) => z
                .iter()
                .filter(|(_, at)| **at > now_ms as f64)
                .map(|(m, _)| m.clone())
                .collect(),
            _ => return Vec::new(),
        };
        match self.entry(queue).map(|e| &e.data) {
            Some(Data::ZSet(z)) => z
                .iter()
                .filter(|(m, _)| live.contains(m))
                .map(|(m, t)| (m.clone(), *t))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The names of the keys that hold something at `now_ms` (expired ones are not counted).
    pub fn live_key_names(&mut self, now_ms: i64) -> Vec<Vec<u8>> {
        self.now = now_ms;
        self.live_keys();
        self.data.keys().cloned().collect()
    }

    /// The keys that hold something now (expired ones are not counted).
    pub fn live_keys(&mut self) -> usize {
        let now = self.now;
        self.data.retain(|_, e| {
            let fields_live = match &e.data {
                Data::Hash(h) => h.values().any(|(_, at)| !field_expired(*at, now)),
                _ => true,
            };
            fields_live && e.expire_at.is_none_or(|at| now <= at)
        });
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
            b"GET" => arity(1)
                .and_then(|()| self.get(rest[0]))
                .map(|v| Value::Bulk(v.map(<[u8]>::to_vec))),
            b"DEL" if !rest.is_empty() => Ok(Value::Integer(
                rest.iter().filter(|k| self.del(k)).count() as i64,
            )),
            b"EXISTS" if !rest.is_empty() => Ok(Value::Integer(
                rest.iter().filter(|k| self.exists(k)).count() as i64,
            )),
            b"PEXPIRE" => arity(2).and_then(|()| self.pexpire(rest[0], rest[1])),
            b"PTTL" => arity(1).map(|()| Value::Integer(self.pttl(rest[0]))),
            b"PUBLISH" | b"SPUBLISH" => arity(2).map(|()| {
                let sharded = name == b"SPUBLISH";
                self.outbox
                    .push((rest[0].to_vec(), rest[1].to_vec(), sharded));
                self.published += 1;
                Value::Integer(0)
            }),
            b"ZADD" if rest.len() >= 3 && rest.len() % 2 == 1 => {
                self.zadd(rest).map(Value::Integer)
            }
            b"ZREM" if rest.len() >= 2 => self.zrem(rest[0], &rest[1..]).map(Value::Integer),
            b"ZCARD" => arity(1).and_then(|()| self.zcard(rest[0]).map(Value::Integer)),
            b"ZSCORE" => arity(2).and_then(|()| {
                self.zscore(rest[0], rest[1])
                    .map(|s| Value::Bulk(s.map(format_score)))
            }),
            b"ZRANGE" => arity(3).and_then(|()| {
                let (Some(start), Some(stop)) = (parse_i64(rest[1]), parse_i64(rest[2])) else {
                    return Err(err(NOT_INTEGER));
                };
                self.zrange(rest[0], start, stop).map(bulk_array)
            }),
            b"ZRANGEBYSCORE" => arity(3).and_then(|()| {
                let (min, max) = score_range(rest[1], rest[2])?;
                self.zrange_by_score(rest[0], min, max).map(bulk_array)
            }),
            b"ZREMRANGEBYSCORE" => arity(3).and_then(|()| {
                let (min, max) = score_range(rest[1], rest[2])?;
                self.zrem_range_by_score(rest[0], min, max)
                    .map(Value::Integer)
            }),
            b"HSETEX" if rest.len() >= 6 => self.hsetex(rest),
            b"HPEXPIRE" if rest.len() >= 5 => self.hpexpire(rest),
            b"HPTTL" if rest.len() >= 4 => self.hpttl(rest),
            b"HDEL" if rest.len() >= 2 => self.hdel(rest[0], &rest[1..]).map(Value::Integer),
            b"HRANDFIELD" => arity(1).and_then(|()| self.hrandfield(rest[0])),
            b"HLEN" => arity(1).and_then(|()| {
                Ok(Value::Integer(
                    self.hash(rest[0])?.map_or(0, |h| h.len() as i64),
                ))
            }),
            b"EVAL" | b"EVALSHA" if rest.len() >= 2 => Ok(self.eval(name == b"EVAL", rest)),
            b"SCRIPT" if rest.len() == 2 && rest[0].eq_ignore_ascii_case(b"LOAD") => {
                lua::load(rest[1]).map(|sha| {
                    self.scripts.insert(sha);
                    Value::Bulk(Some(sha.to_vec()))
                })
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

    /// `SET key value [NX|XX] [PX ms|EX s] [GET]`
    fn set_command(&mut self, args: &[&[u8]]) -> Value {
        let (key, value) = (args[0], args[1]);
        let (mut nx, mut xx, mut px, mut get) = (false, false, None, false);
        let mut i = 2;
        while i < args.len() {
            let opt = args[i].to_ascii_uppercase();
            match opt.as_slice() {
                b"NX" if !xx => nx = true,
                b"XX" if !nx => xx = true,
                b"GET" if !get => get = true,
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
        // With GET, the old value comes back (nil when there was none), and a key that holds
        // something other than a string is refused before anything is written.
        let old = if get {
            match self.get(key) {
                Ok(v) => Value::Bulk(v.map(<[u8]>::to_vec)),
                Err(e) => return e,
            }
        } else {
            Value::Bulk(None)
        };
        let exists = self.entry(key).is_some();
        if (nx && exists) || (xx && !exists) {
            return old;
        }
        self.data.insert(
            key.to_vec(),
            Entry {
                data: Data::Str(value.to_vec()),
                expire_at: px.map(|ms| self.now.saturating_add(ms)),
            },
        );
        if get {
            return old;
        }
        Value::Simple(b"OK".to_vec())
    }

    /// `EVAL` and `EVALSHA`: the script's own source, run by [`lua`].
    fn eval(&mut self, by_body: bool, args: &[&[u8]]) -> Value {
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
        let sha = if by_body {
            // Redis caches the body of every EVAL, so a later EVALSHA finds it.
            match lua::load(args[0]) {
                Ok(sha) => {
                    self.scripts.insert(sha);
                    sha
                }
                Err(e) => return e,
            }
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
        lua::run(self, &sha, &rest[..numkeys], &rest[numkeys..])
    }

    /// The live entry at `key`, dropping it first if it has expired (for a hash whose fields
    /// all expired: once the expiry cycle would have deleted it).
    fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now;
        let lag = self.hash_expiry_lag;
        if self.data.get(key).is_some_and(|e| {
            e.expire_at.is_some_and(|at| now > at)
                || match (&e.data, lag) {
                    // (Empty only for a moment, while `HSETEX` creates it.)
                    (Data::Hash(h), Some(lag)) => {
                        !h.is_empty()
                            && h.values()
                                .all(|(_, at)| at.is_some_and(|at| now > at.saturating_add(lag)))
                    }
                    _ => false,
                }
        }) {
            self.data.remove(key);
        }
        self.data.get_mut(key)
    }

    /// The hash at `key` (`None` if missing), or a WRONGTYPE error reply. Expired fields may
    /// still be in it: field accesses drop them.
    fn hash(&mut self, key: &[u8]) -> Result<Option<&mut Fields>, Value> {
        match self.entry(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::Hash(h),
                ..
            }) => Ok(Some(h)),
            Some(_) => Err(err(WRONGTYPE)),
        }
    }

    /// Whether `field` is in the hash at `key`, expired or not: Redis 8.2's `HPEXPIRE` and
    /// `HDEL` act on an expired field the server has not deleted yet as on a live one.
    fn field_present(&mut self, key: &[u8], field: &[u8]) -> Result<bool, Value> {
        Ok(self.hash(key)?.is_some_and(|h| h.contains_key(field)))
    }

    /// `FIELDS n f1 .. fn` at the end of a hash-field command: the fields, or a syntax error.
    fn fields<'c>(args: &[&'c [u8]], pairs: bool) -> Result<Vec<&'c [u8]>, Value> {
        let n = match args {
            [fields, n, ..] if fields.eq_ignore_ascii_case(b"FIELDS") => parse_i64(n)
                .filter(|&n| n > 0)
                .ok_or_else(|| err("ERR Parameter `numFields` should be greater than 0"))?
                as usize,
            _ => return Err(err("ERR syntax error")),
        };
        let rest = &args[2..];
        if rest.len() != if pairs { 2 * n } else { n } {
            return Err(err("ERR wrong number of arguments"));
        }
        Ok(rest.to_vec())
    }

    /// `HSETEX key PX ms FIELDS n field value ...` (the only form the locks send): 1.
    fn hsetex(&mut self, args: &[&[u8]]) -> Result<Value, Value> {
        let key = args[0];
        if !args[1].eq_ignore_ascii_case(b"PX") {
            return Err(err("ERR syntax error"));
        }
        let ms = parse_i64(args[2])
            .filter(|&ms| ms > 0)
            .ok_or_else(|| err("ERR invalid expire time, must be >= 0 and <= 2^48"))?;
        let pairs = Self::fields(&args[3..], true)?;
        let at = self.now.saturating_add(ms);
        if self.hash(key)?.is_none() {
            self.data.insert(
                key.to_vec(),
                Entry {
                    data: Data::Hash(BTreeMap::new()),
                    expire_at: None,
                },
            );
        }
        let h = self.hash(key)?.ok_or_else(|| err(WRONGTYPE))?;
        for p in pairs.chunks(2) {
            h.insert(p[0].to_vec(), (p[1].to_vec(), Some(at)));
        }
        Ok(Value::Integer(1))
    }

    /// `HPEXPIRE key ms FIELDS n field ...`: per field, -2 when it is not there, 1 when its
    /// expiry was set, 2 when `ms` is 0 and it was deleted. As in Redis 8.2, a field that
    /// expired but was not deleted yet gets the new expiry too (see `engine::rw` for why that
    /// is harmless).
    fn hpexpire(&mut self, args: &[&[u8]]) -> Result<Value, Value> {
        let key = args[0];
        let ms = parse_i64(args[1])
            .filter(|&ms| ms >= 0)
            .ok_or_else(|| err("ERR invalid expire time, must be >= 0 and <= 2^48"))?;
        let fields = Self::fields(&args[2..], false)?;
        self.hash(key)?;
        let at = self.now.saturating_add(ms);
        let mut codes = Vec::new();
        for f in fields {
            let code = if !self.field_present(key, f)? {
                -2
            } else if ms == 0 {
                self.hdel(key, &[f])?;
                2
            } else {
                if let Some(entry) = self.hash(key)?.and_then(|h| h.get_mut(f)) {
                    entry.1 = Some(at);
                }
                1
            };
            codes.push(Value::Integer(code));
        }
        Ok(Value::Array(Some(codes)))
    }

    /// `HPTTL key FIELDS n field ...`: per field, -2 when it is not there or expired (which
    /// deletes nothing), -1 without expiry, else the ms left.
    fn hpttl(&mut self, args: &[&[u8]]) -> Result<Value, Value> {
        let key = args[0];
        let fields = Self::fields(&args[1..], false)?;
        self.hash(key)?;
        let now = self.now;
        let mut out = Vec::new();
        for f in fields {
            let code = match self.hash(key)?.and_then(|h| h.get(f)) {
                Some((_, at)) if field_expired(*at, now) => -2,
                Some((_, Some(at))) => (*at - now).max(0),
                Some((_, None)) => -1,
                None => -2,
            };
            out.push(Value::Integer(code));
        }
        Ok(Value::Array(Some(out)))
    }

    /// `HDEL key field ...`: fields deleted (an expired one not deleted yet counts, as in
    /// Redis 8.2); an emptied hash is deleted.
    pub fn hdel(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<i64, Value> {
        let mut deleted = 0;
        for f in fields {
            if self.field_present(key, f)? {
                if let Some(h) = self.hash(key)? {
                    h.remove(*f);
                    deleted += 1;
                    if h.is_empty() {
                        self.data.remove(key);
                    }
                }
            }
        }
        Ok(deleted)
    }

    /// `HRANDFIELD key`: drops every expired field first (and the hash, if none is left), then
    /// answers a field (here the first; Redis picks one at random) or nil.
    fn hrandfield(&mut self, key: &[u8]) -> Result<Value, Value> {
        let now = self.now;
        let Some(h) = self.hash(key)? else {
            return Ok(Value::Bulk(None));
        };
        h.retain(|_, (_, at)| !field_expired(*at, now));
        let first = h.keys().next().cloned();
        if first.is_none() {
            self.data.remove(key);
        }
        Ok(Value::Bulk(first))
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

    /// `EXISTS` of one key.
    pub fn exists(&mut self, key: &[u8]) -> bool {
        self.entry(key).is_some()
    }

    /// `PEXPIRE key ms`: 1 if the key exists (a non-positive TTL deletes it), else 0.
    pub fn pexpire(&mut self, key: &[u8], ms: &[u8]) -> Result<Value, Value> {
        let ms = parse_i64(ms).ok_or_else(|| err(NOT_INTEGER))?;
        Ok(Value::Integer(self.pexpire_ms(key, ms)))
    }

    /// `PEXPIRE` with a number of milliseconds.
    pub fn pexpire_ms(&mut self, key: &[u8], ms: i64) -> i64 {
        let now = self.now;
        match self.entry(key) {
            None => 0,
            Some(_) if ms <= 0 => {
                self.data.remove(key);
                1
            }
            Some(e) => {
                e.expire_at = Some(now.saturating_add(ms));
                1
            }
        }
    }

    /// `PTTL key`: -2 if missing, -1 without expiry, else the ms left.
    pub fn pttl(&mut self, key: &[u8]) -> i64 {
        let now = self.now;
        match self.entry(key) {
            None => -2,
            Some(Entry {
                expire_at: None, ..
            }) => -1,
            Some(Entry {
                expire_at: Some(at),
                ..
            }) => (*at - now).max(0),
        }
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

    /// The members of the sorted set at `key` in Redis order: by score, then by member.
    fn ordered(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, Value> {
        let mut all: Vec<(Vec<u8>, f64)> = match self.zset(key)? {
            None => Vec::new(),
            Some(z) => z.iter().map(|(m, s)| (m.clone(), *s)).collect(),
        };
        all.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        Ok(all)
    }

    /// Deletes the sorted set at `key` if it is empty, as Redis does.
    fn drop_if_empty(&mut self, key: &[u8]) {
        if matches!(self.zset(key), Ok(Some(z)) if z.is_empty()) {
            self.data.remove(key);
        }
    }

    /// `ZADD key score member [score member ...]`: members newly added.
    pub fn zadd(&mut self, args: &[&[u8]]) -> Result<i64, Value> {
        let mut pairs = Vec::new();
        for p in args[1..].chunks(2) {
            match std::str::from_utf8(p[0])
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
            {
                Some(score) if !score.is_nan() => pairs.push((score, p[1])),
                _ => return Err(err("ERR value is not a valid float")),
            }
        }
        let mut added = 0;
        for (score, member) in pairs {
            added += self.zadd_score(args[0], score, member, false)?;
        }
        Ok(added)
    }

    /// `ZADD key [XX] score member`: 1 if the member is new (never with `xx`), else 0.
    pub fn zadd_score(
        &mut self,
        key: &[u8],
        score: f64,
        member: &[u8],
        xx: bool,
    ) -> Result<i64, Value> {
        if self.zset(key)?.is_none() {
            if xx {
                return Ok(0);
            }
            self.data.insert(
                key.to_vec(),
                Entry {
                    data: Data::ZSet(BTreeMap::new()),
                    expire_at: None,
                },
            );
        }
        let Some(z) = self.zset(key)? else {
            return Err(err(WRONGTYPE));
        };
        if xx {
            if let Some(s) = z.get_mut(member) {
                *s = score;
            }
            return Ok(0);
        }
        let added = z.insert(member.to_vec(), score).is_none();
        if let Some(first) = self.first_scores.as_mut() {
            first
                .entry((key.to_vec(), member.to_vec()))
                .or_insert(score);
        }
        Ok(i64::from(added))
    }

    /// `ZREM key member...`: members removed; an emptied set is deleted, as in Redis.
    pub fn zrem(&mut self, key: &[u8], members: &[&[u8]]) -> Result<i64, Value> {
        let removed = match self.zset(key)? {
            None => 0,
            Some(z) => members.iter().filter(|m| z.remove(**m).is_some()).count(),
        };
        self.drop_if_empty(key);
        Ok(removed as i64)
    }

    /// `ZCARD key`
    pub fn zcard(&mut self, key: &[u8]) -> Result<i64, Value> {
        Ok(self.zset(key)?.map_or(0, |z| z.len() as i64))
    }

    /// `ZSCORE key member`
    pub fn zscore(&mut self, key: &[u8], member: &[u8]) -> Result<Option<f64>, Value> {
        Ok(self.zset(key)?.and_then(|z| z.get(member).copied()))
    }

    /// `ZRANGE key start stop` (ranks from 0, negative from the end).
    pub fn zrange(&mut self, key: &[u8], start: i64, stop: i64) -> Result<Vec<Vec<u8>>, Value> {
        let all = self.ordered(key)?;
        let len = all.len() as i64;
        let start = if start < 0 {
            (len + start).max(0)
        } else {
            start
        };
        let stop = if stop < 0 {
            len + stop
        } else {
            stop.min(len - 1)
        };
        if start > stop || start >= len {
            return Ok(Vec::new());
        }
        Ok(all[start as usize..=stop as usize]
            .iter()
            .map(|(m, _)| m.clone())
            .collect())
    }

    /// `ZRANGEBYSCORE key min max` (both inclusive).
    pub fn zrange_by_score(
        &mut self,
        key: &[u8],
        min: f64,
        max: f64,
    ) -> Result<Vec<Vec<u8>>, Value> {
        Ok(self
            .ordered(key)?
            .into_iter()
            .filter(|(_, s)| *s >= min && *s <= max)
            .map(|(m, _)| m)
            .collect())
    }

    /// `ZREMRANGEBYSCORE key min max` (both inclusive): members removed.
    pub fn zrem_range_by_score(&mut self, key: &[u8], min: f64, max: f64) -> Result<i64, Value> {
        let removed = match self.zset(key)? {
            None => 0,
            Some(z) => {
                let before = z.len();
                z.retain(|_, s| !(*s >= min && *s <= max));
                before - z.len()
            }
        };
        self.drop_if_empty(key);
        Ok(removed as i64)
    }
}

/// A score as Redis 7.0 writes it (`%.17g`; whole numbers without a fraction).
fn format_score(s: f64) -> Vec<u8> {
    if s.is_infinite() {
        return if s > 0.0 {
            b"inf".to_vec()
        } else {
            b"-inf".to_vec()
        };
    }
    if s == s.trunc() && s.abs() < 1e17 {
        format!("{}", s as i64).into_bytes()
    } else {
        format!("{s}").into_bytes()
    }
}

fn bulk_array(items: Vec<Vec<u8>>) -> Value {
    Value::Array(Some(
        items.into_iter().map(|m| Value::Bulk(Some(m))).collect(),
    ))
}

/// The bounds of `ZRANGEBYSCORE`: numbers, `-inf` or `+inf`, exclusive after `(`, as the
/// inclusive bounds that admit the same scores (NaN where none is admitted).
fn score_range(min: &[u8], max: &[u8]) -> Result<(f64, f64), Value> {
    let bound = |b: &[u8], low: bool| {
        let (open, b) = match b.strip_prefix(b"(") {
            Some(rest) => (true, rest),
            None => (false, b),
        };
        let v = match b {
            b"-inf" => Some(f64::NEG_INFINITY),
            b"+inf" | b"inf" => Some(f64::INFINITY),
            _ => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| !s.is_nan()),
        }?;
        Some(match (open, low) {
            (false, _) => v,
            (true, true) => next_up(v),
            (true, false) => -next_up(-v),
        })
    };
    match (bound(min, true), bound(max, false)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(err("ERR min or max is not a float")),
    }
}

/// The least score above `x` (NaN above `+inf`).
fn next_up(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        f64::NAN
    } else if x == f64::NEG_INFINITY {
        f64::MIN
    } else if x == 0.0 {
        f64::from_bits(1)
    } else if x > 0.0 {
        f64::from_bits(x.to_bits() + 1)
    } else {
        f64::from_bits(x.to_bits() - 1)
    }
}

/// A command's name, upper-cased (empty if it is not an array of bulk strings).
fn command_name(command: &[u8]) -> Vec<u8> {
    match resp::decode(command, &Limits::default()) {
        Ok(Status::Complete((Reply::Array(Some(items)), _))) => match items.first() {
            Some(Reply::Bulk(Some(name))) => name.to_ascii_uppercase(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
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
    use crate::engine::ops::{self, Acquire, Extend, Op, Release, ScriptForm};

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
    fn every_script_the_client_loads_compiles_under_its_digest() {
        for script in ops::SCRIPTS {
            let mut n = Node::default();
            let mut load = Vec::new();
            resp::encode_command(&mut load, &[b"SCRIPT", b"LOAD", script.body.as_bytes()]);
            let reply = n.execute(0, &load);
            let mut want = Vec::new();
            Value::Bulk(Some(script.sha.to_vec())).encode(&mut want);
            assert_eq!(
                String::from_utf8_lossy(&reply),
                String::from_utf8_lossy(&want),
                "{}",
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
        assert_eq!(n.pttl(b"k"), 500);
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

    /// A reader that joined a native node (a field of the hash at the writer key) is
    /// released by whatever form its release was written in: a compare-and-delete kept for a
    /// cluster master whose link was never set up (the replica promoted in a failover) is
    /// written for a server not known yet, without hash-field expiry, and goes to the
    /// promoted master as it was written.
    #[test]
    fn a_reader_release_written_for_an_unknown_server_removes_a_native_reader() {
        use crate::engine::ops::Caps;
        use crate::engine::rw::{ReadAcquire, ReadRelease, RwKeys};
        let keys = RwKeys::new(b"lock:0");
        let native = Caps {
            delex: false,
            hsetex: true,
            sharded: true,
        };
        for (caps, announce) in [
            (Caps::default(), true),
            (Caps::default(), false),
            (
                Caps {
                    sharded: true,
                    ..Caps::default()
                },
                true,
            ),
            (native, true),
        ] {
            let mut n = Node::default();
            let mut cmd = Vec::new();
            let join = ReadAcquire {
                keys: &keys,
                token: b"t",
                ttl_ms: 10_000,
                native: true,
            };
            join.encode_for(&mut cmd, ScriptForm::Body, native);
            assert_eq!(n.execute(1000, &cmd), b":1\r\n");
            assert!(n.holds_token(1000, keys.writer(), b"t"));
            let release = ReadRelease {
                resource: b"lock:0",
                keys: &keys,
                token: b"t",
                announce,
            };
            cmd.clear();
            let before = release.encode_for(&mut cmd, ScriptForm::Body, caps);
            let mut at = 0;
            let mut commands: Vec<&[u8]> = Vec::new();
            while at < cmd.len() {
                let Ok(Status::Complete((_, len))) = resp::decode(&cmd[at..], &Limits::default())
                else {
                    panic!("undecodable command");
                };
                commands.push(&cmd[at..at + len]);
                at += len;
            }
            let replies = n.execute_all(1001, &commands);
            let last = replies.last().expect("a reply");
            assert_eq!(replies.len(), before + 1);
            assert!(
                !n.holds_token(1001, keys.writer(), b"t"),
                "{caps:?}: the reader is still a field of {:?} after its release answered {:?}",
                String::from_utf8_lossy(keys.writer()),
                String::from_utf8_lossy(last)
            );
            assert_eq!(n.live_keys(), 0, "{caps:?}");
        }
    }

    /// A fenced writer's write-back reaches every node, also one where the writer key is the
    /// hash of native readers (a node that refused the writer): nothing of the writer is there,
    /// which the script answers as it answers any other holder, not with `WRONGTYPE`.
    #[test]
    fn a_write_back_on_a_native_readers_hash_answers_not_held() {
        use crate::engine::fencing::FenceWrite;
        use crate::engine::keys::fence_key;
        use crate::engine::ops::Caps;
        use crate::engine::rw::{ReadAcquire, RwKeys};
        let keys = RwKeys::new(b"lock:0");
        let native = Caps {
            delex: false,
            hsetex: true,
            sharded: false,
        };
        let mut n = Node::default();
        let mut cmd = Vec::new();
        let join = ReadAcquire {
            keys: &keys,
            token: b"r",
            ttl_ms: 10_000,
            native: true,
        };
        join.encode_for(&mut cmd, ScriptForm::Body, native);
        assert_eq!(n.execute(1000, &cmd), b":1\r\n");
        let fence = fence_key(keys.writer());
        let back = FenceWrite {
            key: keys.writer(),
            fence: &fence,
            token: b"w",
            value: 7,
        };
        assert_eq!(
            run(&mut n, 1001, &back, ScriptForm::Body),
            Value::Integer(0),
            "the write-back where readers hold"
        );
        assert!(n.holds_token(1001, keys.writer(), b"r"), "the reader stays");
    }

    /// A lost write attempt's cleanup reaches every node, also one where the writer key is the
    /// hash of native readers: nothing of the writer is there, and a writer that goes on
    /// waiting still refreshes the intent it left there, rather than the script stopping at
    /// `WRONGTYPE`.
    #[test]
    fn a_write_cleanup_on_a_native_readers_hash_runs_to_its_end() {
        use crate::engine::fair::AttemptIds;
        use crate::engine::ops::Caps;
        use crate::engine::rw::{ReadAcquire, RwKeys, WriteCleanup};
        let keys = RwKeys::new(b"lock:0");
        let native = Caps {
            delex: false,
            hsetex: true,
            sharded: false,
        };
        let mut n = Node::default();
        let mut cmd = Vec::new();
        let join = ReadAcquire {
            keys: &keys,
            token: b"r",
            ttl_ms: 10_000,
            native: true,
        };
        join.encode_for(&mut cmd, ScriptForm::Body, native);
        assert_eq!(n.execute(1000, &cmd), b":1\r\n");
        // The waiting writer's intent, left by a refused attempt.
        let mut add = Vec::new();
        resp::encode_command(&mut add, &[b"ZADD", keys.intents(), b"1100", b"wid"]);
        assert_eq!(n.execute(1000, &add), b":1\r\n");
        let cleanup = WriteCleanup {
            resource: b"lock:0",
            keys: &keys,
            ids: AttemptIds {
                waiter: b"wid",
                token: b"w",
            },
            intent_ms: 500,
        };
        let reply = run(&mut n, 1001, &cleanup, ScriptForm::Body);
        assert_eq!(
            reply,
            Value::Integer(1),
            "the cleanup where readers hold: {}",
            String::from_utf8_lossy(match &reply {
                Value::Error(e) => e,
                _ => b"",
            })
        );
        assert_eq!(
            n.zscore(keys.intents(), b"wid"),
            Ok(Some(1501.0)),
            "the intent refreshed"
        );
        assert!(n.holds_token(1001, keys.writer(), b"r"), "the reader stays");
    }
}
