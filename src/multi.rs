//! All-or-none locks over a set of keys: [`Client::lock_all`], [`Client::try_lock_all`] and
//! the [`MultiLock`] guard.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::client::Client;
use crate::config::check_key;
use crate::driver::Pending;
use crate::engine::hold::Hold;
use crate::engine::kind::{Keys, Spec};
use crate::error::{Error, InvalidArgument};
use crate::rng::Token;

/// The most keys one all-or-none lock may cover. Each node runs one script over the whole set,
/// which blocks that node for its duration, so the set is kept small.
pub const MAX_LOCK_ALL_KEYS: usize = 256;

impl Client {
    /// One attempt to lock every key of `keys` for `ttl`, or none of them, without retrying.
    ///
    /// See [`lock_all`](Client::lock_all) for what is checked. Fails with
    /// [`Error::Contended`] when a quorum could not be had because some key is held elsewhere.
    pub fn try_lock_all<I>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.lock_all_with(checked_keys(keys)?, ttl, false)
    }

    /// Locks every key of `keys` for `ttl`, or none of them, retrying as [`lock`](Client::lock)
    /// does.
    ///
    /// Each node runs one atomic script that takes every key of the set, or none when any of
    /// them is held there; the set is held when a quorum of nodes took all of it, within the
    /// validity, as for the mutex. A lost attempt is released on every node. Each key holds the
    /// guard's token as a mutex key does, so a set and a [`Lock`](crate::Lock) on one of its
    /// keys exclude each other.
    ///
    /// The keys are sorted; the guard lists them in that order. Rejected before anything is
    /// sent: no keys, more than [`MAX_LOCK_ALL_KEYS`], an empty or overlong key, and the same
    /// key twice ([`InvalidArgument::DuplicateKey`]), which almost always means the caller
    /// computed its set wrongly. Deduplicate first if repeats are expected.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let set = client.lock_all(["account:1", "account:2"], Duration::from_secs(5))?;
    /// // ... move money between the two accounts within set.validity() ...
    /// set.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn lock_all<I>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.lock_all_with(checked_keys(keys)?, ttl, true)
    }

    fn lock_all_with(
        &self,
        keys: Vec<Vec<u8>>,
        ttl: Duration,
        wait: bool,
    ) -> Result<MultiLock, Error> {
        let ttl = self.timing(ttl)?;
        let won = {
            let refs = key_refs(&keys);
            let spec = Spec {
                keys: Keys::All(&refs),
                fence: None,
            };
            self.acquire(spec, ttl, wait)?
        };
        Ok(MultiLock {
            client: self.clone(),
            keys,
            token: won.grant.token,
            hold: Hold::new(won.grant.valid_until),
            pending: won.pending,
            released: false,
        })
    }
}

/// The keys as given, checked one by one and as a set, sorted.
fn checked_keys<I>(keys: I) -> Result<Vec<Vec<u8>>, InvalidArgument>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut count = 0usize;
    for key in keys {
        count += 1;
        if count <= MAX_LOCK_ALL_KEYS {
            check_key(key.as_ref())?;
            out.push(key.as_ref().to_vec());
        }
    }
    if count == 0 {
        return Err(InvalidArgument::NoKeys);
    }
    if count > MAX_LOCK_ALL_KEYS {
        return Err(InvalidArgument::TooManyKeys {
            count,
            max: MAX_LOCK_ALL_KEYS,
        });
    }
    out.sort_unstable();
    if let Some(pair) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(InvalidArgument::DuplicateKey {
            key: pair[0].clone(),
        });
    }
    Ok(out)
}

fn key_refs(keys: &[Vec<u8>]) -> Vec<&[u8]> {
    keys.iter().map(Vec::as_slice).collect()
}

/// A held all-or-none lock over a set of keys. Dropping it releases it, best effort; call
/// [`release`](MultiLock::release) to see whether that worked.
///
/// Every key of the set is exclusive until [`validity`](MultiLock::validity) runs out; work
/// that may take longer must [`extend`](MultiLock::extend) the set first.
#[derive(Debug)]
pub struct MultiLock {
    client: Client,
    keys: Vec<Vec<u8>>,
    token: Token,
    hold: Hold,
    /// The acquisition's round, while votes of it may be in flight.
    pending: Pending,
    released: bool,
}

impl MultiLock {
    /// The keys of the set, sorted.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.keys.iter().map(Vec::as_slice)
    }

    /// This holder's token, stored at every key of the set on every node that granted it.
    pub fn token(&self) -> &[u8] {
        self.token.as_bytes()
    }

    /// The time left before any key of the set may be granted to someone else. Zero once it
    /// has run out.
    pub fn validity(&self) -> Duration {
        self.hold.validity(Instant::now())
    }

    /// Resets the TTL of every key to `ttl`, on every node that still holds the whole set with
    /// our token; a node that lost any key (expired, taken by another token, or overwritten
    /// with a value of another type) extends none and counts as refusing.
    ///
    /// Succeeds only if a quorum agrees before the current validity ends, as
    /// [`Lock::extend`](crate::Lock::extend) does. A failed extend never lengthens the
    /// validity but may shorten it, to at most `ttl` minus the drift allowance from the start
    /// of the round, as for [`Lock::extend`](crate::Lock::extend).
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let refs = key_refs(&self.keys);
        let spec = Spec {
            keys: Keys::All(&refs),
            fence: None,
        };
        self.client
            .extend_round(spec, self.token, &mut self.hold, ttl, &self.pending)
    }

    /// Releases every key of the set on every node; keys that expired, hold someone else's
    /// token, or hold a value of another type that someone else wrote there are left alone,
    /// and do not stop the release of the other keys. Each key released is announced on its
    /// wake channel.
    ///
    /// Returns once a quorum of nodes has answered; the other nodes still get the release. A
    /// node acknowledges whatever it found at the keys, so such foreign keys do not make the
    /// release fail.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.release_now()
    }

    fn release_now(&mut self) -> Result<(), Error> {
        let refs = key_refs(&self.keys);
        let spec = Spec {
            keys: Keys::All(&refs),
            fence: None,
        };
        self.client
            .release_round(spec, self.token, &mut self.hold, &self.pending)
    }
}

impl Drop for MultiLock {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_and_bad_sets_are_refused() {
        assert_eq!(
            checked_keys(["b", "c", "a"]).unwrap(),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            checked_keys(Vec::<&str>::new()),
            Err(InvalidArgument::NoKeys)
        );
        assert_eq!(
            checked_keys(["x", "y", "x"]),
            Err(InvalidArgument::DuplicateKey { key: b"x".to_vec() })
        );
        assert_eq!(checked_keys(["x", ""]), Err(InvalidArgument::EmptyKey));
        let many = (0..MAX_LOCK_ALL_KEYS + 3).map(|i| i.to_string());
        assert_eq!(
            checked_keys(many),
            Err(InvalidArgument::TooManyKeys {
                count: MAX_LOCK_ALL_KEYS + 3,
                max: MAX_LOCK_ALL_KEYS
            })
        );
        assert_eq!(
            checked_keys((0..MAX_LOCK_ALL_KEYS).map(|i| i.to_string()))
                .unwrap()
                .len(),
            MAX_LOCK_ALL_KEYS
        );
    }
}
