//! Randomness: lock tokens straight from the OS CSPRNG, retry jitter from a small seeded PRNG.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::time::Duration;

use rand_core::{SeedableRng, TryRng};

/// Random bytes in a token: 160 bits, as the Redlock specification asks (20 bytes).
pub(crate) const TOKEN_BYTES: usize = 20;
/// A token is sent and shown as lowercase hex, so it is printable in logs and tools.
pub(crate) const TOKEN_LEN: usize = TOKEN_BYTES * 2;

/// A lock token: 160 bits from `getrandom`, as 40 hex characters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token([u8; TOKEN_LEN]);

impl Token {
    /// Draws a fresh token from the OS CSPRNG.
    ///
    /// # Panics
    /// Only if the OS has no working random source, in which case no lock could be safe.
    pub fn generate() -> Token {
        let mut raw = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut raw).expect("the OS random source failed");
        Token::from_random(raw)
    }

    /// The token for 160 random bits: their lowercase hex.
    pub fn from_random(raw: [u8; TOKEN_BYTES]) -> Token {
        let mut hex = [0u8; TOKEN_LEN];
        for (i, b) in raw.iter().enumerate() {
            hex[2 * i] = HEX[(b >> 4) as usize];
            hex[2 * i + 1] = HEX[(b & 15) as usize];
        }
        Token(hex)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The token whose text is `text`, if it has a token's shape: 40 lowercase hex characters.
    pub fn parse(text: &[u8]) -> Option<Token> {
        let hex: [u8; TOKEN_LEN] = text.try_into().ok()?;
        hex.iter().all(|b| HEX.contains(b)).then_some(Token(hex))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only a prefix: enough to correlate logs, not enough to release someone's lock.
        write!(f, "Token({}…)", String::from_utf8_lossy(&self.0[..8]))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The randomness a lock engine state machine draws on, passed into every call that may draw:
/// the engine itself has no hidden source. The driver passes [`OsEntropy`]; a simulation passes
/// a seeded generator, so that a seed replays exactly.
pub(crate) trait Entropy {
    /// A fresh lock token for an acquisition attempt.
    fn token(&mut self) -> Token;
    /// 64 uniformly random bits, for retry jitter.
    fn random_bits(&mut self) -> u64;

    /// A delay drawn uniformly from `[0, limit)`.
    fn below(&mut self, limit: Duration) -> Duration {
        scale(self.random_bits(), limit)
    }

    /// A delay drawn uniformly from `[base / 2, base * 3 / 2)`.
    fn around(&mut self, base: Duration) -> Duration {
        if base.is_zero() {
            return Duration::ZERO;
        }
        base / 2 + scale(self.random_bits(), base)
    }
}

/// `limit` scaled by `x / 2^64`: uniform in `[0, limit)` for a uniform `x`.
fn scale(x: u64, limit: Duration) -> Duration {
    let nanos = limit.as_nanos().min(u64::MAX as u128) as u64;
    Duration::from_nanos(((x as u128 * nanos as u128) >> 64) as u64)
}

/// What the driver draws on: every token straight from the OS random source (one `getrandom`
/// each), jitter from a [`Jitter`] seeded from it once.
#[derive(Debug)]
pub(crate) struct OsEntropy {
    jitter: Jitter,
}

impl OsEntropy {
    pub fn new() -> OsEntropy {
        OsEntropy {
            jitter: Jitter::from_os(),
        }
    }
}

impl Entropy for OsEntropy {
    fn token(&mut self) -> Token {
        Token::generate()
    }

    fn random_bits(&mut self) -> u64 {
        self.jitter.step()
    }
}

/// A seeded generator is entropy too: tokens from its bits (for simulations and tests; never
/// for real locks).
impl Entropy for Jitter {
    fn token(&mut self) -> Token {
        let mut raw = [0u8; TOKEN_BYTES];
        for chunk in raw.chunks_mut(8) {
            let v = self.step().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Token::from_random(raw)
    }

    fn random_bits(&mut self) -> u64 {
        self.step()
    }
}

/// xoshiro256++: fast, small, good enough for retry jitter. Never used for the tokens of real
/// locks (only for those of simulated ones).
#[derive(Debug)]
pub(crate) struct Jitter {
    s: [u64; 4],
}

impl TryRng for Jitter {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.step() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.step())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let v = self.step().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

impl SeedableRng for Jitter {
    type Seed = [u8; 32];

    fn from_seed(seed: [u8; 32]) -> Jitter {
        let mut s = [0u64; 4];
        for (i, w) in s.iter_mut().enumerate() {
            *w = u64::from_le_bytes(seed[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        }
        if s == [0; 4] {
            // The all-zero state is a fixed point of xoshiro.
            s = [0x9e37_79b9_7f4a_7c15, 1, 2, 3];
        }
        Jitter { s }
    }
}

impl Jitter {
    /// Seeded from the OS random source, so clients started together do not retry in lockstep.
    pub fn from_os() -> Jitter {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).expect("the OS random source failed");
        Jitter::from_seed(seed)
    }

    fn step(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hex_and_distinct() {
        let a = Token::generate();
        let b = Token::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_bytes().len(), 40);
        assert!(a.as_bytes().iter().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn jitter_stays_in_range_and_spreads() {
        let mut j = Jitter::from_seed([7; 32]);
        let base = Duration::from_millis(100);
        let mut lo = Duration::MAX;
        let mut hi = Duration::ZERO;
        for _ in 0..10_000 {
            let d = j.around(base);
            assert!(d >= base / 2 && d < base * 3 / 2, "{d:?}");
            lo = lo.min(d);
            hi = hi.max(d);
        }
        assert!(lo < Duration::from_millis(55) && hi > Duration::from_millis(145));
        assert_eq!(j.around(Duration::ZERO), Duration::ZERO);
    }
}
