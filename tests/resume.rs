//! Resuming a lock from its key and token: a guard rebuilt by another client (as another
//! process, or this one after a restart, would) extends and releases the lock; a token that
//! does not hold it, or is not shaped like ours, is refused.

mod common;

use std::time::Duration;

use common::*;
use redlock_mux::{Client, Error, InvalidArgument};

const TTL: Duration = Duration::from_secs(10);
/// The first holder's TTL. Its command reaches every node, but the node outside the quorum may
/// run it after the resumed guard's release (the two clients use different connections, and
/// a busy server may read them in either order); a short TTL bounds what such a late grant
/// leaves behind.
const FIRST_TTL: Duration = Duration::from_secs(2);
/// How long the checks of every node wait for such a leftover to expire.
const SETTLE: Duration = Duration::from_secs(3);

#[test]
fn a_resumed_guard_extends_and_releases_the_lock_of_another_client() {
    let cluster = RedisCluster::start(3).unwrap();
    let first = Client::new(cluster.urls()).unwrap();
    let other = Client::new(cluster.urls()).unwrap();

    // Mutex: the first holder stops (forgets its guard, as a process that exited would).
    let lock = first.lock("r:m", FIRST_TTL).unwrap();
    let token = lock.token().to_vec();
    std::mem::forget(lock);
    let mut resumed = other.resume_lock("r:m", &token, TTL).unwrap();
    assert_eq!(resumed.token(), &token[..]);
    assert_eq!(resumed.key(), b"r:m");
    // The validity is the new TTL's, measured from the check.
    assert!(
        resumed.validity() > Duration::from_secs(9),
        "{:?}",
        resumed.validity()
    );
    // On a quorum: the check returns once a quorum has extended, and on the other node the
    // first holder's own SET (on its own connection) may land after our extension.
    let extended = cluster
        .addrs()
        .iter()
        .filter(|&&addr| pttl(addr, b"r:m") > 9000)
        .count();
    assert!(extended >= 2, "extended on {extended} of 3 nodes");
    resumed.extend(TTL).unwrap();
    resumed.release().unwrap();
    // The release returns at the quorum; the last node gets it moments later, and a late
    // grant of the first holder's there expires within FIRST_TTL.
    for &addr in &cluster.addrs() {
        assert!(
            eventually(SETTLE, || dbsize(addr) == 0),
            "keys left on {addr}: {:?}",
            keys(addr)
        );
    }

    // Read, write and all-or-none locks.
    let r = first.read_lock("r:rw", FIRST_TTL).unwrap();
    let t = r.token().to_vec();
    std::mem::forget(r);
    other
        .resume_read_lock("r:rw", &t, TTL)
        .unwrap()
        .release()
        .unwrap();
    let w = first.write_lock("r:rw", FIRST_TTL).unwrap();
    let t = w.token().to_vec();
    std::mem::forget(w);
    let mut w = other.resume_write_lock("r:rw", &t, TTL).unwrap();
    w.extend(TTL).unwrap();
    w.release().unwrap();
    let s = first.lock_all(["r:a", "r:b"], FIRST_TTL).unwrap();
    let t = s.token().to_vec();
    std::mem::forget(s);
    let s = other.resume_lock_all(["r:b", "r:a"], &t, TTL).unwrap();
    assert_eq!(s.keys().collect::<Vec<_>>(), [&b"r:a"[..], b"r:b"]);
    s.release().unwrap();
    // The release returns at the quorum; the last node gets it moments later, and a late
    // grant of the first holder's there expires within FIRST_TTL.
    for &addr in &cluster.addrs() {
        assert!(
            eventually(SETTLE, || dbsize(addr) == 0),
            "keys left on {addr}: {:?}",
            keys(addr)
        );
    }
}

#[test]
fn a_token_that_does_not_hold_the_lock_is_refused_and_nothing_is_released() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = Client::new(cluster.urls()).unwrap();
    let lock = client.lock("r:held", TTL).unwrap();
    let wrong = "0123456789abcdef0123456789abcdef01234567";
    let e = client.resume_lock("r:held", wrong, TTL).unwrap_err();
    assert!(e.is_contended(), "{e}");
    let e = client.resume_lock("r:free", wrong, TTL).unwrap_err();
    assert!(e.is_contended(), "{e}");
    // A read token is not a write lock.
    let r = client.read_lock("r:rw", TTL).unwrap();
    assert!(client.resume_write_lock("r:rw", r.token(), TTL).is_err());
    for &addr in &cluster.addrs() {
        assert_eq!(get(addr, b"r:held").as_deref(), Some(lock.token()));
        assert_eq!(get(addr, b"r:free"), None);
    }
    r.release().unwrap();
    lock.release().unwrap();
}

#[test]
fn a_token_not_shaped_like_ours_is_refused_before_anything_is_sent() {
    let cluster = RedisCluster::start(1).unwrap();
    let client = Client::new(cluster.urls()).unwrap();
    let good = "0123456789abcdef0123456789abcdef01234567";
    for bad in [
        "",
        &good[..39],
        &format!("{good}0"),
        "0123456789ABCDEF0123456789abcdef01234567",
        "0123456789abcdeg0123456789abcdef01234567",
    ] {
        let e = client.resume_lock("k", bad, TTL).unwrap_err();
        assert_eq!(
            e,
            Error::InvalidArgument(InvalidArgument::BadToken),
            "{bad:?}"
        );
        let e = client.resume_lock_all(["k"], bad, TTL).unwrap_err();
        assert_eq!(
            e,
            Error::InvalidArgument(InvalidArgument::BadToken),
            "{bad:?}"
        );
    }
}
