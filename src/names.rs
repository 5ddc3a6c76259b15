//! Where guards keep the names of their keys without allocating once a client is warm: byte
//! buffers lent by the client ([`BufPool`]) and given back when the guard goes, and the sorted
//! keys of an all-or-none set in one such buffer ([`KeySet`]).
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use crate::config::{check_key, MAX_LOCK_ALL_KEYS};
use crate::error::InvalidArgument;

/// The most free buffers a pool keeps; more are dropped. A buffer is free between the end of
/// one guard and the start of the next, so this bounds the guards that can come and go at once
/// without allocating, not the guards one can hold.
const MAX_FREE: usize = 256;

/// The least a buffer is given room for.
const MIN_CAPACITY: usize = 64;

/// Byte buffers lent to the guards of one client (and its clones) for the names of their keys,
/// and kept when given back, so that taking a lock reuses the buffers of the locks before it.
/// A buffer keeps the capacity it grew to: once every size in use has been seen, nothing is
/// allocated.
///
/// In a child after `fork()` whose parent had a thread in the pool at the fork, the pool is
/// never waited on (that thread does not exist in the child): the child's guards allocate
/// their buffers and drop them.
#[derive(Debug)]
pub(crate) struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// The process that made the pool: it alone waits for the pool when another thread has it.
    pid: u32,
}

impl Default for BufPool {
    fn default() -> BufPool {
        BufPool {
            free: Mutex::default(),
            pid: std::process::id(),
        }
    }
}

impl BufPool {
    /// The free buffers, or `None` in a child after `fork()` whose parent held them at the
    /// fork (checked only when they are not free at once: no `getpid` in the usual case).
    fn free(&self) -> Option<MutexGuard<'_, Vec<Vec<u8>>>> {
        // A panic while the list was held cannot leave it inconsistent: it is only pushed to
        // and taken from.
        match self.free.try_lock() {
            Ok(free) => Some(free),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if self.pid == std::process::id() => {
                Some(self.free.lock().unwrap_or_else(PoisonError::into_inner))
            }
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// An empty buffer with room for `len` bytes: the smallest free one that fits, or else the
    /// largest, grown (to a power of two, at least [`MIN_CAPACITY`]); with `usize::MAX`, the
    /// largest as it is.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let Some(mut free) = self.free() else {
            return Vec::with_capacity(if len == usize::MAX { 0 } else { len });
        };
        let fits = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let largest = || {
            free.iter()
                .enumerate()
                .max_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
        };
        let mut buf = match fits.or_else(largest) {
            Some(i) => free.swap_remove(i),
            None => Vec::new(),
        };
        drop(free);
        buf.clear();
        if len != usize::MAX && buf.capacity() < len {
            // Rounded up, so that keys of nearly the same length share buffers.
            buf.reserve(len.max(MIN_CAPACITY).next_power_of_two());
        }
        buf
    }

    /// `bytes`, in a buffer of the pool.
    pub fn copy(&self, bytes: &[u8]) -> Vec<u8> {
        let mut buf = self.take(bytes.len());
        buf.extend_from_slice(bytes);
        buf
    }

    /// Gives `buf` back.
    pub fn put(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        if let Some(mut free) = self.free() {
            if free.len() < MAX_FREE {
                free.push(buf);
            }
        }
    }
}

/// The keys of an all-or-none set, sorted, without duplicates, in one buffer: each key's
/// length as 4 bytes (little-endian), then the key.
#[derive(Default)]
pub(crate) struct KeySet {
    buf: Vec<u8>,
    len: usize,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

/// Bytes of a key's length in a [`KeySet`].
const LEN_BYTES: usize = 4;

impl KeySet {
    /// The set of `keys`, checked one by one and as a set, and sorted, in a buffer of `pool`.
    /// Refused as [`Client::lock_all`](crate::Client::lock_all) says.
    pub fn build<I>(keys: I, pool: &BufPool) -> Result<KeySet, InvalidArgument>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        // The keys as they come, before they are sorted into a buffer of their size. The
        // largest free buffer: how much the keys take is not known before they are read.
        let mut scratch = pool.take(usize::MAX);
        let set = KeySet::sorted(keys, &mut scratch, pool);
        pool.put(scratch);
        set
    }

    fn sorted<I>(keys: I, scratch: &mut Vec<u8>, pool: &BufPool) -> Result<KeySet, InvalidArgument>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        // Where each key lies in `scratch`, as the keys came.
        let mut spans = [(0usize, 0usize); MAX_LOCK_ALL_KEYS];
        let mut count = 0usize;
        for key in keys {
            if count < MAX_LOCK_ALL_KEYS {
                let key = key.as_ref();
                check_key(key)?;
                spans[count] = (scratch.len(), key.len());
                scratch.extend_from_slice(key);
            }
            count += 1;
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
        let spans = &mut spans[..count];
        let key = |&(start, len): &(usize, usize)| &scratch[start..start + len];
        spans.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        if let Some(pair) = spans.windows(2).find(|w| key(&w[0]) == key(&w[1])) {
            return Err(InvalidArgument::DuplicateKey {
                key: key(&pair[0]).to_vec(),
            });
        }
        let mut buf = pool.take(count * LEN_BYTES + scratch.len());
        for span in spans.iter() {
            let key = key(span);
            // A key is at most MAX_KEY_LEN bytes, far below 2^32.
            buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
            buf.extend_from_slice(key);
        }
        Ok(KeySet { buf, len: count })
    }

    /// The keys, sorted.
    pub fn iter(&self) -> SetKeys<'_> {
        SetKeys {
            rest: &self.buf,
            left: self.len,
        }
    }

    /// The first key (empty for an empty set).
    pub fn first(&self) -> &[u8] {
        self.iter().next().unwrap_or_default()
    }

    /// Calls `f` with the keys as a slice, which the engine takes, without allocating.
    pub fn with_slice<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let mut refs: [&[u8]; MAX_LOCK_ALL_KEYS] = [&[]; MAX_LOCK_ALL_KEYS];
        let mut n = 0;
        for (slot, key) in refs.iter_mut().zip(self.iter()) {
            *slot = key;
            n += 1;
        }
        f(&refs[..n])
    }

    /// The buffer, to give back to the pool.
    pub fn into_buf(self) -> Vec<u8> {
        self.buf
    }
}

/// The keys of a [`KeySet`], in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct SetKeys<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for SetKeys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let (len, rest) = self.rest.split_first_chunk::<LEN_BYTES>()?;
        let (key, rest) = rest.split_at(u32::from_le_bytes(*len) as usize);
        self.rest = rest;
        self.left -= 1;
        Some(key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for SetKeys<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_KEY_LEN;

    fn set<I>(keys: I) -> Result<Vec<Vec<u8>>, InvalidArgument>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        KeySet::build(keys, &BufPool::default()).map(|s| s.iter().map(<[u8]>::to_vec).collect())
    }

    #[test]
    fn keys_are_sorted_and_bad_sets_are_refused() {
        assert_eq!(
            set(["b", "c", "a"]).unwrap(),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(set(Vec::<&str>::new()), Err(InvalidArgument::NoKeys));
        assert_eq!(
            set(["x", "y", "x"]),
            Err(InvalidArgument::DuplicateKey { key: b"x".to_vec() })
        );
        assert_eq!(set(["x", ""]), Err(InvalidArgument::EmptyKey));
        let many = (0..MAX_LOCK_ALL_KEYS + 3).map(|i| i.to_string());
        assert_eq!(
            set(many),
            Err(InvalidArgument::TooManyKeys {
                count: MAX_LOCK_ALL_KEYS + 3,
                max: MAX_LOCK_ALL_KEYS
            })
        );
        let all = set((0..MAX_LOCK_ALL_KEYS).map(|i| i.to_string())).unwrap();
        assert_eq!(all.len(), MAX_LOCK_ALL_KEYS);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        let long = vec![b'k'; MAX_KEY_LEN];
        assert_eq!(set([&long[..], b"a"]).unwrap(), vec![b"a".to_vec(), long]);
        assert_eq!(
            set([vec![b'k'; MAX_KEY_LEN + 1]]),
            Err(InvalidArgument::KeyTooLong {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            })
        );
    }

    #[test]
    fn a_set_iterates_and_slices_alike() {
        let s = KeySet::build(["b", "a", "cc"], &BufPool::default()).unwrap();
        assert_eq!(s.iter().len(), 3);
        assert_eq!(s.first(), b"a");
        let listed: Vec<&[u8]> = s.iter().collect();
        s.with_slice(|keys| assert_eq!(keys, &listed[..]));
        assert_eq!(listed, [&b"a"[..], b"b", b"cc"]);
    }

    #[test]
    fn the_pool_lends_the_smallest_buffer_that_fits() {
        let pool = BufPool::default();
        pool.put(Vec::with_capacity(1000));
        pool.put(Vec::with_capacity(10));
        pool.put(Vec::with_capacity(100));
        assert_eq!(pool.take(50).capacity(), 100);
        assert_eq!(pool.take(5).capacity(), 10);
        // None fits: the largest is grown, to a power of two.
        let grown = pool.take(5000);
        assert_eq!(grown.capacity(), 8192);
        assert!(pool.free().unwrap().is_empty());
        pool.put(grown);
        pool.put(Vec::with_capacity(10));
        assert!(pool.take(usize::MAX).capacity() >= 5000);
        pool.put(Vec::new());
        assert_eq!(pool.free().unwrap().len(), 1);
    }
}
