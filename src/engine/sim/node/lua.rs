//! The lock scripts' own Lua source, run as Redis runs it: Lua 5.1, `KEYS` and `ARGV`,
//! `redis.call` and `redis.pcall` into the node's commands, and Redis's conversions both ways.
//! What a simulated node runs for `EVAL` and `EVALSHA` is the very text the client sends, so a
//! defect in a script is a defect of the simulation too.
//!
//! As in Redis 7 and later (the servers `diff.rs` compares with):
//!
//! - a reply reaches Lua as a number (integer), a string (bulk), `false` (nil bulk or nil
//!   array), a table (array, recursively), `{ok = ...}` (status) or `{err = ...}` (error);
//! - a script's value goes back as an integer (a number, truncated; `true` is 1), a bulk
//!   string, a nil bulk (`false`, `nil`), an error (a table with `err`), a status (a table with
//!   `ok`) or an array (a table's items from 1 up to the first `nil`);
//! - `redis.call` raises a command's error reply, and `redis.pcall` returns it as
//!   `{err = ...}`; arguments are strings, or numbers written as `%.17g` does;
//! - an error the script raised is answered as its message followed by
//!   `script: <sha>, on @user_script:<line>.`, a Lua error (not a table) as `ERR <message>`
//!   first; `redis.error_reply` and `redis.status_reply` build the tables;
//! - globals can be neither created nor read when missing, and Lua's `pcall` gives a caught
//!   error table as its message;
//! - the node's clock answers `TIME`, and writes are refused inside a script as Redis refuses
//!   them (see [`Refusals`]).
//!
//! One interpreter per thread runs every node's scripts there (a script keeps nothing between
//! runs, as in Redis, where globals are locked), each script compiled once.

use std::cell::RefCell;
use std::collections::HashMap;

use mlua::{Either, Function, IntoLua, Lua, LuaOptions, MultiValue, StdLib, Table, Value as Lv};

use super::{err, Node};
use crate::resp::Value;
use crate::sha1::sha1_hex;

/// What a node refuses to a script's write commands, as Redis refuses them inside a script
/// (`scriptVerifyWriteCommandAllow`, `scriptVerifyOOM`), checked in this order: only until the
/// script's first write command went through, since a script that already wrote cannot be
/// stopped half-way. A refused command is an error reply: raised by `redis.call`, returned by
/// `redis.pcall`. Reads, `PUBLISH` and `TIME` always run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refusals {
    /// A read-only replica: every write command (`READONLY`).
    pub read_only: bool,
    /// A failed background save with `stop-writes-on-bgsave-error`: every write command
    /// (`MISCONF`).
    pub misconf: bool,
    /// Over `maxmemory` when the script started: every command that may add memory (`SET`,
    /// `ZADD`, `HSETEX`; `OOM`), while deletes and expiries still run.
    pub oom: bool,
}

const READONLY: &str = "READONLY You can't write against a read only replica.";
const MISCONF: &str = "MISCONF Redis is configured to save RDB snapshots, but it's currently \
    unable to persist to disk. Commands that may modify the data set are disabled, because this \
    instance is configured to report errors during writes if RDB snapshotting fails \
    (stop-writes-on-bgsave-error option). Please check the Redis logs for details about the \
    RDB error.";
const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// The commands of the node that write (Redis's `write` flag).
const WRITES: &[&[u8]] = &[
    b"SET",
    b"DEL",
    b"PEXPIRE",
    b"ZADD",
    b"ZREM",
    b"ZREMRANGEBYSCORE",
    b"HSETEX",
    b"HPEXPIRE",
    b"HDEL",
    b"FLUSHALL",
];

/// The write commands that may add memory (Redis's `denyoom` flag).
const DENY_OOM: &[&[u8]] = &[b"SET", b"ZADD", b"HSETEX"];

/// Commands a script may not call (Redis's `noscript` flag).
const NO_SCRIPT: &[&[u8]] = &[
    b"EVAL",
    b"EVALSHA",
    b"EVAL_RO",
    b"EVALSHA_RO",
    b"SCRIPT",
    b"FCALL",
    b"FCALL_RO",
    b"FUNCTION",
    b"MULTI",
    b"EXEC",
    b"DISCARD",
    b"WATCH",
    b"UNWATCH",
    b"SUBSCRIBE",
    b"UNSUBSCRIBE",
    b"PSUBSCRIBE",
    b"PUNSUBSCRIBE",
    b"SSUBSCRIBE",
    b"SUNSUBSCRIBE",
    b"HELLO",
    b"AUTH",
    b"CLIENT",
    b"RESET",
    b"QUIT",
];

/// The `redis` library and the locked globals, in Lua, given the primitives that run one
/// command: `call` raises a command's error, `pcall` returns it as `{err = ...}`, and
/// `message` reads what `call` raised. As in Redis, `error_reply` reads an error code from the
/// message's first word, `ERR` when there is none.
const PRELUDE: &str = r#"
local call, pcall, message = ...
local error, select, type, tostring = error, select, type, tostring
local sub, find, gsub = string.sub, string.find, string.gsub
local redis = {call = call, pcall = pcall}
function redis.error_reply(...)
  local e = ...
  if select('#', ...) ~= 1 or type(e) ~= 'string' then
    return {err = 'ERR wrong number or type of arguments'}
  end
  if sub(e, 1, 1) ~= '-' then e = '-' .. e end
  local code, msg = 'ERR', sub(e, 2)
  local space = find(e, ' ', 1, true)
  if space then code, msg = sub(e, 2, space - 1), sub(e, space + 1) end
  msg = gsub(gsub(msg, '^[\r\n]+', ''), '[\r\n]+$', '')
  return {err = code .. ' ' .. msg}
end
function redis.status_reply(...)
  local s = ...
  if select('#', ...) ~= 1 or type(s) ~= 'string' then
    return {err = 'ERR wrong number or type of arguments'}
  end
  return {ok = s}
end
rawset(_G, 'redis', redis)
-- Redis's `pcall` hands a caught error table over as its message.
local lua_pcall = _G.pcall
local function caught(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if type(e) == 'userdata' then e = message(e) end
  if type(e) == 'table' then
    local m = e.err
    if type(m) == 'string' or type(m) == 'number' then e = m end
  end
  return false, e
end
rawset(_G, 'pcall', function(f, ...) return caught(lua_pcall(f, ...)) end)
setmetatable(_G, {
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
  __newindex = function()
    error('Attempt to modify a readonly table', 2)
  end,
})
"#;

/// The name scripts are compiled under, as Redis names them: Lua's messages then say
/// `user_script:LINE:` as Redis's do.
const CHUNK: &str = "@user_script";

/// One thread's Lua interpreter.
struct Interpreter {
    lua: Lua,
    globals: Table,
    /// Every script compiled here, by digest.
    scripts: RefCell<HashMap<[u8; 40], Function>>,
    /// The digest of every body seen here (computing it again for each `EVAL` would cost more
    /// than running most scripts).
    digests: RefCell<HashMap<Vec<u8>, [u8; 40]>>,
    /// Lua's `xpcall`, which runs a script...
    xpcall: Function,
    /// ...with this handler, which turns what it raised into an error table with its line.
    handler: Function,
}

/// What a running script reaches through `redis.call`: the node (moved in for the run), what
/// it refuses, and whether a write command went through yet.
struct Running {
    node: Node,
    refusals: Refusals,
    dirty: bool,
}

thread_local! {
    static LUA: Interpreter = Interpreter::new().expect("a Lua 5.1 interpreter");
}

impl Interpreter {
    fn new() -> mlua::Result<Interpreter> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::new(),
        )?;
        // Scripts make garbage in small amounts: collect it less eagerly than Lua's default
        // (after the heap doubled), for speed; the heap stays small.
        lua.gc_set_pause(400);
        let globals = lua.globals();
        // Redis takes these out of the base library.
        for name in ["dofile", "loadfile"] {
            globals.raw_set(name, Lv::Nil)?;
        }
        let call = lua.create_function(|lua, args| match redis_command(lua, &args)? {
            Err(e) => Err(mlua::Error::external(ErrorReply(e))),
            Ok(reply) => Ok(reply),
        })?;
        let pcall = lua.create_function(|lua, args| match redis_command(lua, &args)? {
            Err(e) => Ok(Either::Right(lua_of(lua, Value::Error(e))?)),
            Ok(reply) => Ok(reply),
        })?;
        let message = lua.create_function(|lua, e: Lv| {
            Ok(match reply_error(&e) {
                Some(ErrorReply(m)) => Lv::String(lua.create_string(m)?),
                None => e,
            })
        })?;
        lua.load(PRELUDE)
            .set_name("=redis")
            .call::<()>((call, pcall, message))?;
        let xpcall = globals.raw_get("xpcall")?;
        let handler = lua.create_function(error_handler)?;
        Ok(Interpreter {
            lua,
            globals,
            scripts: RefCell::new(HashMap::new()),
            digests: RefCell::new(HashMap::new()),
            xpcall,
            handler,
        })
    }

    /// Compiles `body` unless a script with its digest is here already.
    fn load(&self, body: &[u8]) -> Result<[u8; 40], Value> {
        if let Some(sha) = self.digests.borrow().get(body) {
            return Ok(*sha);
        }
        let sha = sha1_hex(body);
        let f = self
            .lua
            .load(body)
            .set_name(CHUNK)
            .into_function()
            .map_err(|e| {
                let message = match e {
                    mlua::Error::SyntaxError { message, .. } => message,
                    other => other.to_string(),
                };
                Value::Error(
                    format!("ERR Error compiling script (new function): {message}").into_bytes(),
                )
            })?;
        self.scripts.borrow_mut().insert(sha, f);
        self.digests.borrow_mut().insert(body.to_vec(), sha);
        Ok(sha)
    }

    fn run(&self, node: &mut Node, sha: &[u8; 40], keys: &[&[u8]], args: &[&[u8]]) -> Value {
        let Some(script) = self.scripts.borrow().get(sha).cloned() else {
            return err("NOSCRIPT No matching script. Please use EVAL.");
        };
        let set = |name: &str, items: &[&[u8]]| -> mlua::Result<()> {
            let t = self.lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, string(&self.lua, item)?)?;
            }
            self.globals.raw_set(name, t)
        };
        if let Err(e) = set("KEYS", keys).and_then(|()| set("ARGV", args)) {
            return Value::Error(format!("ERR {e}").into_bytes());
        }
        self.lua.set_app_data(Running {
            refusals: node.refusals,
            node: std::mem::take(node),
            dirty: false,
        });
        let outcome = self.xpcall.call::<(bool, Lv)>((&script, &self.handler));
        let running = self
            .lua
            .remove_app_data::<Running>()
            .expect("the running script's node");
        *node = running.node;
        match outcome {
            Ok((true, value)) => reply_of(&value),
            Ok((false, Lv::Table(e))) => raised(&e, sha),
            Ok((false, other)) => Value::Error(format!("ERR {other:?}").into_bytes()),
            Err(e) => Value::Error(format!("ERR {e}").into_bytes()),
        }
    }
}

/// Compiles a script (`EVAL`'s body, `SCRIPT LOAD`) on this thread: its digest, or Redis's
/// compile error.
pub(super) fn load(body: &[u8]) -> Result<[u8; 40], Value> {
    LUA.with(|lua| lua.load(body))
}

/// Runs the script with digest `sha` (compiled by [`load`] on this thread) on `node`.
pub(super) fn run(node: &mut Node, sha: &[u8; 40], keys: &[&[u8]], args: &[&[u8]]) -> Value {
    LUA.with(|lua| lua.run(node, sha, keys, args))
}

/// An error the script raised, as Redis answers it: its message, then where it was raised.
fn raised(e: &Table, sha: &[u8; 40]) -> Value {
    let mut message = match e.raw_get::<Lv>("err") {
        Ok(Lv::String(s)) => s.as_bytes().to_vec(),
        _ => b"ERR unknown error".to_vec(),
    };
    if let Ok(line) = e.raw_get::<i64>("line") {
        message.extend_from_slice(b" script: ");
        message.extend_from_slice(sha);
        message.extend_from_slice(format!(", on {CHUNK}:{line}.").as_bytes());
    }
    Value::Error(one_line(message))
}

/// The handler of a script's error, called where it was raised: an error table (a string
/// becomes `{err = 'ERR ' .. message}`), with the line of the script's innermost frame.
fn error_handler(lua: &Lua, e: Lv) -> mlua::Result<Table> {
    let t = match e {
        Lv::Table(t) => t,
        e if reply_error(&e).is_some() => {
            let t = lua.create_table()?;
            if let Some(ErrorReply(m)) = reply_error(&e) {
                t.raw_set("err", lua.create_string(m)?)?;
            }
            t
        }
        other => {
            let text = match &other {
                Lv::String(s) => s.to_string_lossy(),
                Lv::Number(n) => format!("{n}"),
                Lv::Integer(n) => format!("{n}"),
                Lv::Error(e) => e.to_string(),
                v => format!("{v:?}"),
            };
            let t = lua.create_table()?;
            t.raw_set("err", format!("ERR {text}"))?;
            t
        }
    };
    for level in 1.. {
        let Some(frame) = lua.inspect_stack(level, |d| {
            (
                d.source().source.as_deref() == Some(CHUNK),
                d.current_line(),
            )
        }) else {
            break;
        };
        if let (true, Some(line)) = frame {
            t.raw_set("source", CHUNK)?;
            t.raw_set("line", line)?;
            break;
        }
    }
    Ok(t)
}

/// The error reply that `redis.call` raised.
#[derive(Debug)]
struct ErrorReply(Vec<u8>);

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl std::error::Error for ErrorReply {}

/// The error reply in what `redis.call` raised, if that is what `e` is.
fn reply_error(e: &Lv) -> Option<&ErrorReply> {
    fn find(e: &mlua::Error) -> Option<&ErrorReply> {
        match e {
            mlua::Error::CallbackError { cause, .. } => find(cause),
            other => other.downcast_ref(),
        }
    }
    match e {
        Lv::Error(e) => find(e),
        _ => None,
    }
}

/// Runs one command of a script (`redis.call` and `redis.pcall`): the reply converted for Lua,
/// or the error reply's message.
fn redis_command(
    lua: &Lua,
    args: &MultiValue,
) -> mlua::Result<Result<Either<String, Lv>, Vec<u8>>> {
    let reply = match command_args(args) {
        Err(e) => err(e),
        Ok(argv) => {
            let refs: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            let mut running = lua
                .app_data_mut::<Running>()
                .ok_or_else(|| mlua::Error::runtime("no script is running"))?;
            command(&mut running, &refs)
        }
    };
    Ok(Ok(match reply {
        Value::Error(e) => return Ok(Err(e)),
        Value::Bulk(Some(b)) => match String::from_utf8(b) {
            Ok(s) => Either::Left(s),
            Err(b) => Either::Right(lua_of(lua, Value::Bulk(Some(b.into_bytes())))?),
        },
        other => Either::Right(lua_of(lua, other)?),
    }))
}

/// A script's arguments to `redis.call` as a command: strings as they are, numbers as `%.17g`
/// writes them.
fn command_args(args: &MultiValue) -> Result<Vec<Vec<u8>>, &'static str> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call");
    }
    args.iter()
        .map(|a| match a {
            Lv::String(s) => Ok(s.as_bytes().to_vec()),
            Lv::Number(n) => Ok(g17(*n).into_bytes()),
            Lv::Integer(n) => Ok(n.to_string().into_bytes()),
            _ => Err("ERR Lua redis lib command arguments must be strings or integers"),
        })
        .collect()
}

/// One command of a running script: refused as Redis refuses it there, or run by the node.
fn command(running: &mut Running, args: &[&[u8]]) -> Value {
    let name = args[0].to_ascii_uppercase();
    let is = |list: &[&[u8]]| list.contains(&name.as_slice());
    if is(NO_SCRIPT) {
        return err("ERR This Redis command is not allowed from script");
    }
    let write = is(WRITES);
    if !running.dirty {
        let r = running.refusals;
        if write && r.read_only {
            return err(READONLY);
        }
        if write && r.misconf {
            return err(MISCONF);
        }
        if is(DENY_OOM) && r.oom {
            return err(OOM);
        }
    }
    running.dirty |= write;
    let node = &mut running.node;
    script_only(node, &name, &args[1..]).unwrap_or_else(|| node.dispatch(args))
}

/// The commands only the scripts send (no client sends them on its own): `TIME` from the
/// node's clock, `ZRANK`, `ZCOUNT` and `ZADD` with options.
fn script_only(node: &mut Node, name: &[u8], rest: &[&[u8]]) -> Option<Value> {
    let r = match (name, rest) {
        (b"TIME", []) => {
            let (s, ms) = (node.now.div_euclid(1000), node.now.rem_euclid(1000));
            Ok(Value::Array(Some(vec![
                Value::Bulk(Some(s.to_string().into_bytes())),
                Value::Bulk(Some((ms * 1000).to_string().into_bytes())),
            ])))
        }
        (b"ZRANK", [key, member]) => node.ordered(key).map(|all| {
            match all.iter().position(|(m, _)| m.as_slice() == *member) {
                Some(i) => Value::Integer(i as i64),
                None => Value::Bulk(None),
            }
        }),
        (b"ZCOUNT", [key, min, max]) => super::score_range(min, max).and_then(|(min, max)| {
            node.zrange_by_score(key, min, max)
                .map(|m| Value::Integer(m.len() as i64))
        }),
        (b"ZADD", [key, option, ..]) if option.first().is_some_and(u8::is_ascii_alphabetic) => {
            zadd_with_options(node, key, &rest[1..])
        }
        _ => return None,
    };
    Some(r.unwrap_or_else(|e| e))
}

/// `ZADD key [NX|XX] [CH] score member ...`: members added (or, with `CH`, added or changed).
fn zadd_with_options(node: &mut Node, key: &[u8], args: &[&[u8]]) -> Result<Value, Value> {
    let (mut nx, mut xx, mut ch) = (false, false, false);
    let mut i = 0;
    while let Some(opt) = args
        .get(i)
        .filter(|a| a.first().is_some_and(u8::is_ascii_alphabetic))
    {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"CH" => ch = true,
            _ => return Err(err("ERR syntax error")),
        }
        i += 1;
    }
    if nx && xx {
        return Err(err(
            "ERR XX and NX options at the same time are not compatible",
        ));
    }
    let pairs = &args[i..];
    if pairs.is_empty() || pairs.len() % 2 != 0 {
        return Err(err("ERR syntax error"));
    }
    let mut parsed = Vec::new();
    for p in pairs.chunks(2) {
        match std::str::from_utf8(p[0])
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            Some(score) if !score.is_nan() => parsed.push((score, p[1])),
            _ => return Err(err("ERR value is not a valid float")),
        }
    }
    let mut counted = 0;
    for (score, member) in parsed {
        let before = node.zscore(key, member)?;
        match before {
            Some(_) if nx => {}
            None if xx => {}
            _ => {
                node.zadd_score(key, score, member, false)?;
                counted += i64::from(before.is_none() || (ch && before != Some(score)));
            }
        }
    }
    Ok(Value::Integer(counted))
}

/// A reply as a script sees it.
fn lua_of(lua: &Lua, reply: Value) -> mlua::Result<Lv> {
    Ok(match reply {
        Value::Integer(n) => Lv::Number(n as f64),
        Value::Bulk(Some(b)) => Lv::String(lua.create_string(b)?),
        Value::Bulk(None) | Value::Array(None) => Lv::Boolean(false),
        Value::Array(Some(items)) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Value::Bulk(Some(b)) => t.raw_set(i + 1, string(lua, &b)?)?,
                    other => t.raw_set(i + 1, lua_of(lua, other)?)?,
                }
            }
            Lv::Table(t)
        }
        Value::Simple(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", string(lua, &s)?)?;
            Lv::Table(t)
        }
        Value::Error(e) => {
            let t = lua.create_table()?;
            t.raw_set("err", string(lua, &e)?)?;
            Lv::Table(t)
        }
    })
}

/// Bytes as a Lua string to store: passed straight to Lua when they are UTF-8 (as nearly every
/// key, token and reply is), which spares mlua a handle on the string.
fn string<'a>(lua: &Lua, bytes: &'a [u8]) -> mlua::Result<impl IntoLua + 'a> {
    Ok(match std::str::from_utf8(bytes) {
        Ok(s) => Either::Left(s),
        Err(_) => Either::Right(lua.create_string(bytes)?),
    })
}

/// What a script returned, as its reply.
fn reply_of(value: &Lv) -> Value {
    match value {
        Lv::String(s) => Value::Bulk(Some(s.as_bytes().to_vec())),
        Lv::Boolean(true) => Value::Integer(1),
        // Redis casts the double to `long long`: toward zero.
        Lv::Number(n) => Value::Integer(*n as i64),
        Lv::Integer(n) => Value::Integer(*n),
        Lv::Table(t) => {
            if let Ok(Lv::String(e)) = t.raw_get::<Lv>("err") {
                return Value::Error(one_line(e.as_bytes().to_vec()));
            }
            if let Ok(Lv::String(s)) = t.raw_get::<Lv>("ok") {
                return Value::Simple(one_line(s.as_bytes().to_vec()));
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Lv>(i) {
                    Ok(Lv::Nil) | Err(_) => break,
                    Ok(item) => items.push(reply_of(&item)),
                }
            }
            Value::Array(Some(items))
        }
        _ => Value::Bulk(None),
    }
}

/// A status or error message on one line, as Redis sends it.
fn one_line(mut message: Vec<u8>) -> Vec<u8> {
    for b in &mut message {
        if *b == b'\r' || *b == b'\n' {
            *b = b' ';
        }
    }
    message
}

/// A number as C's `%.17g` writes it (Redis 7.0's form for a number passed to `redis.call`;
/// later versions write whole numbers alike, and others in their shortest form).
fn g17(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == x.trunc() && x.abs() < 1e17 {
        return if x == 0.0 && x.is_sign_negative() {
            "-0".into()
        } else {
            format!("{}", x as i64)
        };
    }
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{x:.*}", (16 - exp) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_redis_writes_them() {
        for (x, s) in [
            (0.0, "0"),
            (1_700_000_000_123.0, "1700000000123"),
            (-3.0, "-3"),
            (0.1, "0.10000000000000001"),
            (1.5, "1.5"),
            (1e20, "1e+20"),
            (1.25e-7, "1.2499999999999999e-07"),
            (123_456.789, "123456.789"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(g17(x), s, "{x}");
        }
    }
}
