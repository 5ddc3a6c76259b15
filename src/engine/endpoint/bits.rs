//! A set of small indexes (connections by [`ConnId::index`](super::ConnId::index), or nodes),
//! as bits of 64-bit words: one word for a client of up to 32 nodes, grown when a cluster
//! member's links outnumber that. Clearing and taking keep the words, so a set in steady use
//! allocates nothing.
#![forbid(unsafe_code)]

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Bits {
    words: Vec<u64>,
}

impl Bits {
    /// An empty set with room for indexes below `n`.
    pub fn with_room(n: usize) -> Bits {
        Bits {
            words: vec![0; n.div_ceil(64)],
        }
    }

    /// Adds `i` (the set grows if it has no room for it).
    pub fn insert(&mut self, i: usize) {
        let w = i / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (i % 64);
    }

    pub fn contains(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & 1 << (i % 64) != 0)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Empties the set, keeping its room.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Removes and returns the smallest index in the set.
    pub fn pop_first(&mut self) -> Option<usize> {
        for (k, w) in self.words.iter_mut().enumerate() {
            if *w != 0 {
                let bit = w.trailing_zeros() as usize;
                *w &= *w - 1;
                return Some(k * 64 + bit);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_past_any_word_are_kept_and_popped_in_order() {
        let mut b = Bits::with_room(10);
        assert!(b.is_empty());
        for i in [2047, 0, 63, 64, 128, 5] {
            b.insert(i);
        }
        assert!(b.contains(2047) && b.contains(64) && !b.contains(65));
        let mut out = Vec::new();
        while let Some(i) = b.pop_first() {
            out.push(i);
        }
        assert_eq!(out, [0, 5, 63, 64, 128, 2047]);
        assert!(b.is_empty());
        b.insert(3);
        b.clear();
        assert!(b.is_empty());
    }
}
