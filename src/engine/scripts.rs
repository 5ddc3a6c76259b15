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
//! Every fragment ends with a newline, so a `--` comment never runs into the next one. Redis
//! ignores the comments; the SHA-1 digest that `EVALSHA` sends is computed at compile time from
//! the final text. Which command sends each script, and how its reply is read, is in the module
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
}

impl Script {
    /// A script whose digest is computed at compile time.
    pub const fn new(body: &'static str) -> Script {
        Script {
            body,
            sha: sha1_hex(body.as_bytes()),
        }
    }
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

/// Mutex compare-and-delete, announced on the wake channel: `release.lua`.
pub static RELEASE: Script = Script::new(lua!("release.lua"));

/// Mutex compare-and-PEXPIRE: `extend.lua`.
pub static EXTEND: Script = Script::new(lua!("extend.lua"));

/// Fair mutex acquire: the fair gate, then `fair_acquire.lua`. Returns 1 (taken), 0 (refused,
/// not queued) or 2 + rank (refused, queued behind `rank` others; see `fair_gate.lua`).
pub static FAIR_ACQUIRE: Script =
    Script::new(concat!(fair_gate!("", "false"), lua!("fair_acquire.lua")));

/// A waiter leaves a fair queue, telling the next one if the lock is free: `leave.lua`.
pub static LEAVE: Script = Script::new(lua!("leave.lua"));

/// Write acquire of a read-write lock, leaving an intent when refused (write-preferring
/// policy): `write_acquire.lua`.
pub static WRITE_ACQUIRE: Script = Script::new(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("write_acquire.lua"),
));

/// [`WRITE_ACQUIRE`] behind the fair queue's gate; 2 + rank is a refusal that left the writer
/// queued behind `rank` others.
pub static FAIR_WRITE_ACQUIRE: Script =
    Script::new(concat!(fair_gate!("w", "false"), lua!("write_acquire.lua")));

/// Read acquire of a read-write lock, refused by a writer or a live writer intent:
/// `read_acquire.lua`.
pub static READ_ACQUIRE: Script = Script::new(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("read_acquire.lua"),
));

/// [`READ_ACQUIRE`] behind the fair queue's gate, where readers at the head share and a reader
/// the queue lets through ignores intents; 2 + rank is a refusal that left the reader queued
/// behind `rank` others (those up to the last writer ahead of it).
pub static FAIR_READ_ACQUIRE: Script =
    Script::new(concat!(fair_gate!("r", "true"), lua!("read_acquire.lua")));

/// Cleanup after a lost write attempt, refreshing the intent of a writer that goes on waiting:
/// `write_cleanup.lua`.
pub static WRITE_CLEANUP: Script =
    Script::new(concat!(lua!("node_now.lua"), lua!("write_cleanup.lua")));

/// Removes a reader's token or a writer's intent, announcing it: `set_release.lua`.
pub static SET_RELEASE: Script = Script::new(lua!("set_release.lua"));

/// A reader's extend, on the node's clock: `read_extend.lua`.
pub static READ_EXTEND: Script =
    Script::new(concat!(lua!("node_now.lua"), lua!("read_extend.lua")));

/// Semaphore acquire: one of the node's slots, refused when they are all taken:
/// `sem_acquire.lua`.
pub static SEM_ACQUIRE: Script = Script::new(concat!(
    lua!("node_now.lua"),
    lua!("no_queue.lua"),
    lua!("sem_acquire.lua"),
));

/// [`SEM_ACQUIRE`] behind the fair queue's gate (only the head may go); 2 is a refusal that
/// left the waiter queued.
pub static FAIR_SEM_ACQUIRE: Script =
    Script::new(concat!(fair_gate!("", "false"), lua!("sem_acquire.lua")));

/// A semaphore holder's release (and a lost attempt's cleanup), deleting the set with its
/// last live holder: `sem_release.lua`.
pub static SEM_RELEASE: Script =
    Script::new(concat!(lua!("node_now.lua"), lua!("sem_release.lua")));

/// The live holders of a semaphore on one node: `sem_count.lua`.
pub static SEM_COUNT: Script = Script::new(concat!(lua!("node_now.lua"), lua!("sem_count.lua")));
/// A writer becomes a reader of the same read-write lock, atomically on each node:
/// `downgrade.lua`.
pub static DOWNGRADE: Script = Script::new(concat!(lua!("node_now.lua"), lua!("downgrade.lua")));

/// Undoes a lost downgrade: removes the reader entry and the writer key holding the token:
/// `downgrade_undo.lua`.
pub static DOWNGRADE_UNDO: Script = Script::new(lua!("downgrade_undo.lua"));

/// All-or-none acquire of a set of keys: `acquire_all.lua`.
pub static ACQUIRE_ALL: Script = Script::new(lua!("acquire_all.lua"));

/// Compare-and-delete of every key of a set, each announced on its own channel:
/// `release_all.lua`.
pub static RELEASE_ALL: Script = Script::new(lua!("release_all.lua"));

/// All-or-none compare-and-PEXPIRE of a set: `extend_all.lua`.
pub static EXTEND_ALL: Script = Script::new(lua!("extend_all.lua"));

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
pub static FENCED_ACQUIRE: Script =
    Script::new(fenced!(2, lua!("no_queue.lua"), lua!("fair_acquire.lua")));

/// [`FAIR_ACQUIRE`], fenced. KEYS lock, fence counter, queue, expiries; ARGV token, ttl,
/// waiter, ticket, entry TTL, join. Returns the counter (1 or more), or -1 - rank (`-1` when not
/// queued, or at the head).
pub static FAIR_FENCED_ACQUIRE: Script = Script::new(fenced!(
    2,
    "local kind, readers_share = '', false\n",
    lua!("fair_gate.lua"),
    lua!("fair_acquire.lua")
));

/// [`WRITE_ACQUIRE`], fenced on the writer key. KEYS writer, readers, intents, fence counter;
/// ARGV token, ttl, intent ms, waiter. Returns the counter (1 or more) or -1.
pub static FENCED_WRITE_ACQUIRE: Script =
    Script::new(fenced!(4, lua!("no_queue.lua"), lua!("write_acquire.lua")));

/// [`FAIR_WRITE_ACQUIRE`], fenced on the writer key. KEYS writer, readers, intents, fence
/// counter, queue, expiries; ARGV token, ttl, intent ms, waiter, ticket, entry TTL, join.
/// Returns the counter (1 or more), or -1 - rank (`-1` when not queued, or at the head).
pub static FAIR_FENCED_WRITE_ACQUIRE: Script = Script::new(fenced!(
    4,
    "local kind, readers_share = 'w', false\n",
    lua!("fair_gate.lua"),
    lua!("write_acquire.lua")
));

/// All-or-none acquire behind the fair queue of every key of the set:
/// `fair_acquire_all.lua`. Returns 1, 0 or 2 + rank as [`FAIR_ACQUIRE`] does (the rank: the most
/// entries ahead of the waiter in any of its queues).
pub static FAIR_ACQUIRE_ALL: Script =
    Script::new(concat!(lua!("node_now.lua"), lua!("fair_acquire_all.lua")));

/// The fencing write-back: raises the counter while the lock is still held:
/// `fence_write.lua`.
pub static FENCE_WRITE: Script = Script::new(lua!("fence_write.lua"));

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
    &SEM_COUNT,
    &SEM_RELEASE,
];

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
