//! Every Lua script the lock algorithms run, in one place.
//!
//! Each script's text is in `scripts/*.lua`, commented: what its KEYS and ARGV are, what it
//! returns, and why each step that is not obvious is there. Shared fragments are separate files,
//! concatenated at compile time:
//!
//! - `node_now.lua` defines `node_now()`, the node's clock in ms, for every script that reads it;
//! - `fair_gate.lua` is the fair queue's gate, preceded by a one-line prelude that sets its two
//!   parameters (`kind`, `readers_share`); `no_queue.lua` defines the same names (`queued`,
//!   `won()`, `refused()`) for scripts without a queue;
//! - `write_acquire.lua` and `read_acquire.lua` are the bodies shared by the plain and the fair
//!   read-write acquire scripts, and `fair_acquire.lua` the mutex's;
//! - `fence_check.lua` and `fence_grant.lua` make a fenced acquire of any of those: the acquire
//!   becomes a function `attempt()` between them (see `fenced!`), and they check, raise and
//!   return the lock key's fence counter.
//!
//! Every fragment ends with a newline, so a `--` comment never runs into the next one. What is
//! sent and hashed is the code alone: comments, indentation and trailing blanks are taken out at
//! compile time ([`code`]), and every line break is kept, so that the line a Lua error names is
//! the line in the files. The SHA-1 digest that `EVALSHA` sends is computed at compile time from
//! that final text. Which command sends each script, and how its reply is read, is in the module
//! of its lock kind (`ops`, `fair`, `rw`, `multi`, `fencing`). The simulation's nodes run
//! these very texts in Lua 5.1 as Redis does (`sim/node/lua.rs`), and a differential test runs
//! them on both against a real `redis-server`.
#![forbid(unsafe_code)]

use crate::sha1::sha1_hex;

/// A Lua script and its SHA-1 digest.
#[derive(Debug)]
pub struct Script {
    /// The script's source.
    pub body: &'static str,
    /// Lowercase hex SHA-1 of `body`, as `EVALSHA` wants it.
    pub sha: [u8; 40],
    /// For a script that announces releases with `PUBLISH`: the same script announcing with
    /// `SPUBLISH`, for the masters of Redis Cluster members (see [`Script::announcing`]).
    sharded: Option<&'static Script>,
}

impl Script {
    /// A script whose digest is computed at compile time.
    pub const fn new(body: &'static str) -> Script {
        Script {
            body,
            sha: sha1_hex(body.as_bytes()),
            sharded: None,
        }
    }

    /// A script that announces releases with `PUBLISH`, and `sharded`, its text with
    /// `SPUBLISH` instead.
    const fn announcing_with(body: &'static str, sharded: &'static Script) -> Script {
        Script {
            body,
            sha: sha1_hex(body.as_bytes()),
            sharded: Some(sharded),
        }
    }

    /// The script to send to a node: this one, or, on a Redis Cluster member's master
    /// (`sharded`), its variant that announces with `SPUBLISH` on the channel in the lock's
    /// slot, when it announces at all.
    pub fn announcing(&'static self, sharded: bool) -> &'static Script {
        match self.sharded {
            Some(s) if sharded => s,
            _ => self,
        }
    }
}

/// The code of the Lua text `src`: each line without its comment, its indentation and its
/// trailing blanks, every line break kept. Quoted strings are kept as they are; a long bracket
/// (`[[`, `--[[`), which no script uses, stops the build rather than be misread. Writes into
/// `out` when it is long enough (the second pass), and returns the code's length.
const fn strip(src: &[u8], out: &mut [u8]) -> usize {
    let write = !out.is_empty();
    let (mut at, mut o) = (0, 0);
    // Where the line's code ends once trailing blanks are dropped.
    let mut line_end = 0;
    let mut line_start = true;
    while at < src.len() {
        let c = src[at];
        if c == b'\n' {
            o = line_end;
            if write {
                out[o] = b'\n';
            }
            o += 1;
            line_end = o;
            line_start = true;
            at += 1;
            continue;
        }
        if line_start && (c == b' ' || c == b'\t') {
            at += 1;
            continue;
        }
        line_start = false;
        if c == b'-' && at + 1 < src.len() && src[at + 1] == b'-' {
            if at + 2 < src.len() && src[at + 2] == b'[' {
                panic!("a long comment in a script: write `--` comments");
            }
            while at < src.len() && src[at] != b'\n' {
                at += 1;
            }
            continue;
        }
        if c == b'[' && at + 1 < src.len() && (src[at + 1] == b'[' || src[at + 1] == b'=') {
            panic!("a long string in a script: write a quoted string");
        }
        if c == b'\'' || c == b'"' {
            // A quoted string, escapes included, to its closing quote.
            if write {
                out[o] = c;
            }
            o += 1;
            at += 1;
            while at < src.len() && src[at] != c {
                if src[at] == b'\n' {
                    panic!("an unterminated string in a script");
                }
                let n = if src[at] == b'\\' { 2 } else { 1 };
                let mut k = 0;
                while k < n && at < src.len() {
                    if write {
                        out[o] = src[at];
                    }
                    o += 1;
                    at += 1;
                    k += 1;
                }
            }
            if at == src.len() {
                panic!("an unterminated string in a script");
            }
            if write {
                out[o] = c;
            }
            o += 1;
            at += 1;
            line_end = o;
            continue;
        }
        if write {
            out[o] = c;
        }
        o += 1;
        at += 1;
        if c != b' ' && c != b'\t' {
            line_end = o;
        }
    }
    line_end
}

/// The length of [`strip`]'s code of `src`.
const fn code_len(src: &str) -> usize {
    strip(src.as_bytes(), &mut [])
}

/// [`strip`]'s code of `src`, `N` bytes long ([`code_len`]).
const fn code<const N: usize>(src: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = strip(src.as_bytes(), &mut out);
    assert!(n == N);
    out
}

/// The code of a script's text, as a `&'static str` (see [`code`]).
macro_rules! code {
    ($body:expr) => {{
        const SRC: &str = $body;
        const N: usize = code_len(SRC);
        const TEXT: [u8; N] = code::<N>(SRC);
        match core::str::from_utf8(&TEXT) {
            Ok(s) => s,
            Err(_) => panic!("a script's text is UTF-8"),
        }
    }};
}

/// How long `body` is with every `'publish'` made `'spublish'`.
const fn sharded_len(body: &str) -> usize {
    body.len() + count_publish(body.as_bytes())
}

const PUBLISH: &[u8] = b"'publish'";

/// Whether `PUBLISH` starts at `at` in `b`.
const fn publish_at(b: &[u8], at: usize) -> bool {
    if at + PUBLISH.len() > b.len() {
        return false;
    }
    let mut k = 0;
    while k < PUBLISH.len() {
        if b[at + k] != PUBLISH[k] {
            return false;
        }
        k += 1;
    }
    true
}

/// How many times `'publish'` occurs in `b`.
const fn count_publish(b: &[u8]) -> usize {
    let (mut at, mut n) = (0, 0);
    while at < b.len() {
        if publish_at(b, at) {
            n += 1;
            at += PUBLISH.len();
        } else {
            at += 1;
        }
    }
    n
}

/// `body` with every `'publish'` made `'spublish'`, `N` bytes long ([`sharded_len`]).
const fn sharded_text<const N: usize>(body: &str) -> [u8; N] {
    let b = body.as_bytes();
    let mut out = [0u8; N];
    let (mut at, mut o) = (0, 0);
    while at < b.len() {
        if publish_at(b, at) {
            let mut k = 0;
            out[o] = b'\'';
            out[o + 1] = b's';
            o += 2;
            while k + 1 < PUBLISH.len() {
                out[o] = PUBLISH[k + 1];
                o += 1;
                k += 1;
            }
            at += PUBLISH.len();
        } else {
            out[o] = b[at];
            o += 1;
            at += 1;
        }
    }
    out
}

/// The script `$body` announces with, and its variant that announces with `SPUBLISH` (the
/// same text, each `'publish'` made `'spublish'`), as statics `$name` and `$sharded`.
macro_rules! announcing {
    ($(#[$doc:meta])* $name:ident, $sharded:ident, $body:expr) => {
        $(#[$doc])*
        pub static $name: Script = Script::announcing_with(code!($body), &$sharded);

        #[doc = concat!("[`", stringify!($name), "`] announcing with `SPUBLISH`, for Redis Cluster members.")]
        pub static $sharded: Script = Script::new({
            const BODY: &str = code!($body);
            const N: usize = sharded_len(BODY);
            const TEXT: [u8; N] = sharded_text::<N>(BODY);
            match core::str::from_utf8(&TEXT) {
                Ok(s) => s,
                Err(_) => panic!("a script's text is UTF-8"),
            }
        });
    };
}

/// Includes a file of `scripts/`.
macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("scripts/", $file))
    };
}

/// The prelude that sets the fair gate's parameters, then the gate (after `node_now`).
macro_rules! fair_gate {
    ($kind:literal, $readers_share:literal) => {
        concat!(
            "local kind, readers_share = '",
            $kind,
            "', ",
            $readers_share,
            "\n",
            lua!("node_now.lua"),
            lua!("fair_gate.lua"),
        )
    };
}

announcing!(
    /// Mutex compare-and-delete, announced on the wake channel: `release.lua`.
    RELEASE,
    RELEASE_SHARDED,
    lua!("release.lua")
);

/// Mutex compare-and-PEXPIRE: `extend.lua`.
pub static EXTEND: Script = Script::new(code!(lua!("extend.lua")));

/// Fair mutex acquire: the fair gate, then `fair_acquire.lua`. Returns 1 (taken), 0 (refused,
/// not queued) or 2 + rank (refused, queued behind `rank` others; see `fair_gate.lua`).
pub static FAIR_ACQUIRE: Script = Script::new(code!(concat!(
    fair_gate!("", "false"),
    lua!("fair_acquire.lua")
)));

announcing!(
    /// A waiter leaves a fair queue, telling the next one if the lock is free: `leave.lua`.
    LEAVE,
    LEAVE_SHARDED,
    lua!("leave.lua")
);

/// Write acquire of a read-write lock, leaving an intent when refused (write-preferring
/// policy): `write_acquire.lua`.
pub static WRITE_ACQUIRE: Script = Script::new(code!(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("write_acquire.lua"),
)));

/// [`WRITE_ACQUIRE`] behind the fair queue's gate; 2 + rank is a refusal that left the writer
/// queued behind `rank` others.
pub static FAIR_WRITE_ACQUIRE: Script = Script::new(code!(concat!(
    fair_gate!("w", "false"),
    lua!("write_acquire.lua")
)));

/// Read acquire of a read-write lock, refused by a writer or a live writer intent:
/// `read_acquire.lua`.
pub static READ_ACQUIRE: Script = Script::new(code!(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("read_acquire.lua"),
)));

/// [`READ_ACQUIRE`] behind the fair queue's gate, where readers at the head share and a reader
/// the queue lets through ignores intents; 2 + rank is a refusal that left the reader queued
/// behind `rank` others (those up to the last writer ahead of it).
pub static FAIR_READ_ACQUIRE: Script = Script::new(code!(concat!(
    fair_gate!("r", "true"),
    lua!("read_acquire.lua")
)));

announcing!(
    /// Cleanup after a lost write attempt, refreshing the intent of a writer that goes on
    /// waiting: `write_cleanup.lua`.
    WRITE_CLEANUP,
    WRITE_CLEANUP_SHARDED,
    concat!(lua!("node_now.lua"), lua!("write_cleanup.lua"))
);

announcing!(
    /// Removes a reader's token or a writer's intent, announcing it: `set_release.lua`.
    SET_RELEASE,
    SET_RELEASE_SHARDED,
    lua!("set_release.lua")
);

announcing!(
    /// Removes a reader's token from the reader set and from the hash at the writer key,
    /// announcing it: `read_release.lua`.
    READ_RELEASE,
    READ_RELEASE_SHARDED,
    lua!("read_release.lua")
);

/// A reader's extend, on the node's clock: `read_extend.lua`.
pub static READ_EXTEND: Script = Script::new(code!(concat!(
    lua!("node_now.lua"),
    lua!("read_extend.lua")
)));

/// Semaphore acquire: one of the node's slots, refused when they are all taken:
/// `sem_acquire.lua`.
pub static SEM_ACQUIRE: Script = Script::new(code!(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("sem_acquire.lua"),
)));

/// [`SEM_ACQUIRE`] behind the fair queue's gate (only the head may go); 2 is a refusal that
/// left the waiter queued.
pub static FAIR_SEM_ACQUIRE: Script = Script::new(code!(concat!(
    fair_gate!("", "false"),
    lua!("sem_acquire.lua")
)));

/// A fair acquire of a semaphore's one slot per node, its key: the fair queue's gate, then
/// `sem_key_acquire.lua` (the unfair acquire is `SET NX PX GET`, without a script).
pub static FAIR_SEM_KEY_ACQUIRE: Script = Script::new(code!(concat!(
    fair_gate!("", "false"),
    lua!("sem_key_acquire.lua")
)));

announcing!(
    /// A semaphore holder's release (and a lost attempt's cleanup), deleting the set with its
    /// last live holder: `sem_release.lua`.
    SEM_RELEASE,
    SEM_RELEASE_SHARDED,
    concat!(lua!("node_now.lua"), lua!("sem_release.lua"))
);

/// The live holders of a semaphore on one node: `sem_count.lua`.
pub static SEM_COUNT: Script =
    Script::new(code!(concat!(lua!("node_now.lua"), lua!("sem_count.lua"))));
announcing!(
    /// A writer becomes a reader of the same read-write lock, atomically on each node:
    /// `downgrade.lua`.
    DOWNGRADE,
    DOWNGRADE_SHARDED,
    concat!(lua!("node_now.lua"), lua!("downgrade.lua"))
);

announcing!(
    /// Undoes a lost downgrade: removes the reader entry and the writer key holding the token:
    /// `downgrade_undo.lua`.
    DOWNGRADE_UNDO,
    DOWNGRADE_UNDO_SHARDED,
    lua!("downgrade_undo.lua")
);

/// All-or-none acquire of a set of keys: `acquire_all.lua`.
pub static ACQUIRE_ALL: Script = Script::new(code!(lua!("acquire_all.lua")));

announcing!(
    /// Compare-and-delete of every key of a set, each announced on its own channel:
    /// `release_all.lua`.
    RELEASE_ALL,
    RELEASE_ALL_SHARDED,
    lua!("release_all.lua")
);

/// All-or-none compare-and-PEXPIRE of a set: `extend_all.lua`.
pub static EXTEND_ALL: Script = Script::new(code!(lua!("extend_all.lua")));

/// A fenced acquire script: the fence counter's check (`fence_check.lua`) with the counter at
/// `KEYS[$fence]`, the acquire made a function `attempt()` of the fragments given, and
/// `fence_grant.lua`, which raises and returns the counter when the attempt took the lock.
macro_rules! fenced {
    ($fence:literal, $($attempt:expr),+ $(,)?) => {
        concat!(
            "local fence_key = KEYS[", $fence, "]\n",
            lua!("fence_check.lua"),
            lua!("node_now.lua"),
            "local function attempt()\n",
            $($attempt,)+
            "end\n",
            lua!("fence_grant.lua"),
        )
    };
}

/// Mutex acquire that raises and returns the fence counter: the acquire of
/// `fair_acquire.lua` without a queue, fenced. KEYS lock, fence counter; ARGV token, ttl.
/// Returns the counter (1 or more) or -1.
pub static FENCED_ACQUIRE: Script = Script::new(code!(fenced!(
    2,
    lua!("no_queue.lua"),
    lua!("fair_acquire.lua")
)));

/// [`FAIR_ACQUIRE`], fenced. KEYS lock, fence counter, queue, expiries; ARGV token, ttl,
/// waiter, ticket, entry TTL, join. Returns the counter (1 or more), or -1 - rank (`-1` when not
/// queued, or at the head).
pub static FAIR_FENCED_ACQUIRE: Script = Script::new(code!(fenced!(
    2,
    "local kind, readers_share = '', false\n",
    lua!("fair_gate.lua"),
    lua!("fair_acquire.lua")
)));

/// [`WRITE_ACQUIRE`], fenced on the writer key. KEYS writer, readers, intents, fence counter;
/// ARGV token, ttl, intent ms, waiter. Returns the counter (1 or more) or -1.
pub static FENCED_WRITE_ACQUIRE: Script = Script::new(code!(fenced!(
    4,
    lua!("no_queue.lua"),
    lua!("write_acquire.lua")
)));

/// [`FAIR_WRITE_ACQUIRE`], fenced on the writer key. KEYS writer, readers, intents, fence
/// counter, queue, expiries; ARGV token, ttl, intent ms, waiter, ticket, entry TTL, join.
/// Returns the counter (1 or more), or -1 - rank (`-1` when not queued, or at the head).
pub static FAIR_FENCED_WRITE_ACQUIRE: Script = Script::new(code!(fenced!(
    4,
    "local kind, readers_share = 'w', false\n",
    lua!("fair_gate.lua"),
    lua!("write_acquire.lua")
)));

/// All-or-none acquire behind the fair queue of every key of the set:
/// `fair_acquire_all.lua`. Returns 1, 0 or 2 + rank as [`FAIR_ACQUIRE`] does (the rank: the most
/// entries ahead of the waiter in any of its queues).
pub static FAIR_ACQUIRE_ALL: Script = Script::new(code!(concat!(
    lua!("node_now.lua"),
    lua!("fair_acquire_all.lua")
)));

/// The fencing write-back: raises the counter while the lock is still held:
/// `fence_write.lua`.
pub static FENCE_WRITE: Script = Script::new(code!(lua!("fence_write.lua")));

/// Every script, loaded on each connection as it is set up so `EVALSHA` rarely misses.
pub static SCRIPTS: &[&Script] = &[
    &RELEASE,
    &EXTEND,
    &FAIR_ACQUIRE,
    &LEAVE,
    &WRITE_ACQUIRE,
    &FAIR_WRITE_ACQUIRE,
    &FAIR_READ_ACQUIRE,
    &WRITE_CLEANUP,
    &READ_ACQUIRE,
    &SET_RELEASE,
    &READ_RELEASE,
    &READ_EXTEND,
    &DOWNGRADE,
    &DOWNGRADE_UNDO,
    &ACQUIRE_ALL,
    &RELEASE_ALL,
    &EXTEND_ALL,
    &FENCED_ACQUIRE,
    &FAIR_FENCED_ACQUIRE,
    &FENCED_WRITE_ACQUIRE,
    &FAIR_FENCED_WRITE_ACQUIRE,
    &FAIR_ACQUIRE_ALL,
    &FENCE_WRITE,
    &SEM_ACQUIRE,
    &FAIR_SEM_ACQUIRE,
    &FAIR_SEM_KEY_ACQUIRE,
    &SEM_COUNT,
    &SEM_RELEASE,
];

/// The script of ours, or its variant that announces with `SPUBLISH`, whose digest is `sha`.
pub fn by_sha(sha: &[u8]) -> Option<&'static Script> {
    SCRIPTS
        .iter()
        .flat_map(|s| [Some(*s), s.sharded])
        .flatten()
        .find(|s| s.sha[..] == *sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_distinct_and_ends_its_fragments_with_a_newline() {
        for (i, a) in SCRIPTS.iter().enumerate() {
            assert!(a.body.ends_with('\n'), "{}", a.body);
            for b in &SCRIPTS[i + 1..] {
                assert_ne!(a.sha, b.sha);
            }
        }
        for fragment in [
            lua!("node_now.lua"),
            lua!("no_queue.lua"),
            lua!("fair_gate.lua"),
            lua!("write_acquire.lua"),
            lua!("read_acquire.lua"),
            lua!("fence_check.lua"),
            lua!("fence_grant.lua"),
            lua!("fair_acquire_all.lua"),
        ] {
            assert!(fragment.ends_with('\n'));
        }
    }

    #[test]
    fn the_sharded_variants_announce_with_spublish_and_nothing_else_changes() {
        for s in SCRIPTS {
            let Some(sharded) = s.sharded else {
                assert!(!s.body.contains("'publish'"), "{}", s.body);
                assert!(std::ptr::eq(s.announcing(true), *s));
                continue;
            };
            assert!(s.body.contains("redis.pcall('publish', "));
            assert_eq!(sharded.body, s.body.replace("'publish'", "'spublish'"));
            assert_eq!(sharded.sha, sha1_hex(sharded.body.as_bytes()));
            assert!(std::ptr::eq(s.announcing(true), sharded));
            assert!(std::ptr::eq(s.announcing(false), *s));
        }
    }

    #[test]
    fn scripts_are_sent_without_comments_and_keep_their_lines() {
        let src = "-- a comment\n  local a = '--not a comment' -- but this is\n\tlocal b = \"it's \\\" --\"  \n\nreturn a..b\n";
        let want = "\nlocal a = '--not a comment'\nlocal b = \"it's \\\" --\"\n\nreturn a..b\n";
        let n = code_len(src);
        let mut out = vec![0u8; n];
        assert_eq!(strip(src.as_bytes(), &mut out), n);
        assert_eq!(std::str::from_utf8(&out).unwrap(), want);
        for (script, file) in [
            (&RELEASE, lua!("release.lua")),
            (&EXTEND, lua!("extend.lua")),
            (&ACQUIRE_ALL, lua!("acquire_all.lua")),
            (&FENCE_WRITE, lua!("fence_write.lua")),
        ] {
            assert_eq!(script.body.lines().count(), file.lines().count());
            for (code, line) in script.body.lines().zip(file.lines()) {
                let kept = line.split("--").next().unwrap().trim();
                assert_eq!(code, kept, "{line}");
            }
        }
        for s in SCRIPTS {
            assert!(!s.body.contains("--"), "{}", s.body);
            assert!(s.body.lines().all(|l| l.trim() == l), "{}", s.body);
        }
    }

    #[test]
    fn the_digest_is_the_sha1_of_the_text() {
        // SHA-1 of "return 1", as `redis-cli SCRIPT LOAD "return 1"` prints it.
        assert_eq!(
            &Script::new("return 1").sha,
            b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
        assert!(FAIR_READ_ACQUIRE
            .body
            .starts_with("local kind, readers_share = 'r', true\n"));
    }
}
