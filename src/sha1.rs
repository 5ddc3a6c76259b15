//! SHA-1 as a `const fn`, so the digests that `EVALSHA` needs for our Lua
//! scripts are compile-time constants:
//!
//! ```text
//! const SHA: [u8; 40] = sha1_hex(SCRIPT.as_bytes());
//! ```
//!
//! SHA-1 is used here only because Redis names cached scripts by it; nothing
//! in this crate relies on it for security.
#![forbid(unsafe_code)]

const H0: [u32; 5] = [
    0x6745_2301,
    0xEFCD_AB89,
    0x98BA_DCFE,
    0x1032_5476,
    0xC3D2_E1F0,
];

/// Lowercase hexadecimal SHA-1 digest of `data`.
pub(crate) const fn sha1_hex(data: &[u8]) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha1(data);
    let mut out = [0u8; 40];
    let mut i = 0;
    while i < 20 {
        out[2 * i] = HEX[(digest[i] >> 4) as usize];
        out[2 * i + 1] = HEX[(digest[i] & 0x0f) as usize];
        i += 1;
    }
    out
}

/// Raw 20-byte SHA-1 digest of `data`.
pub(crate) const fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h = H0;

    // Whole 64-byte blocks straight from the input.
    let full = data.len() / 64;
    let mut b = 0;
    while b < full {
        h = compress(h, data, b * 64);
        b += 1;
    }

    // The remainder, the 0x80 marker and the big-endian bit length fill one
    // or two final blocks.
    let rem = data.len() - full * 64;
    let mut tail = [0u8; 128];
    let mut i = 0;
    while i < rem {
        tail[i] = data[full * 64 + i];
        i += 1;
    }
    tail[rem] = 0x80;
    let tail_len = if rem < 56 { 64 } else { 128 };
    let bits = (data.len() as u64).wrapping_mul(8).to_be_bytes();
    let mut j = 0;
    while j < 8 {
        tail[tail_len - 8 + j] = bits[j];
        j += 1;
    }
    h = compress(h, &tail, 0);
    if tail_len == 128 {
        h = compress(h, &tail, 64);
    }

    let mut out = [0u8; 20];
    let mut k = 0;
    while k < 5 {
        let word = h[k].to_be_bytes();
        out[4 * k] = word[0];
        out[4 * k + 1] = word[1];
        out[4 * k + 2] = word[2];
        out[4 * k + 3] = word[3];
        k += 1;
    }
    out
}

/// Runs the compression function over the 64-byte block at `buf[at..at + 64]`.
const fn compress(h: [u32; 5], buf: &[u8], at: usize) -> [u32; 5] {
    let mut w = [0u32; 80];
    let mut t = 0;
    while t < 16 {
        let p = at + 4 * t;
        w[t] = u32::from_be_bytes([buf[p], buf[p + 1], buf[p + 2], buf[p + 3]]);
        t += 1;
    }
    while t < 80 {
        w[t] = (w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]).rotate_left(1);
        t += 1;
    }

    let [mut a, mut b, mut c, mut d, mut e] = h;
    t = 0;
    while t < 80 {
        let (f, k) = if t < 20 {
            ((b & c) | (!b & d), 0x5A82_7999)
        } else if t < 40 {
            (b ^ c ^ d, 0x6ED9_EBA1)
        } else if t < 60 {
            ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC)
        } else {
            (b ^ c ^ d, 0xCA62_C1D6)
        };
        let temp = a
            .rotate_left(5)
            .wrapping_add(f)
            .wrapping_add(e)
            .wrapping_add(k)
            .wrapping_add(w[t]);
        e = d;
        d = c;
        c = b.rotate_left(30);
        b = a;
        a = temp;
        t += 1;
    }

    [
        h[0].wrapping_add(a),
        h[1].wrapping_add(b),
        h[2].wrapping_add(c),
        h[3].wrapping_add(d),
        h[4].wrapping_add(e),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    // Evaluated at compile time: proves the function is usable in consts.
    const EMPTY: [u8; 40] = sha1_hex(b"");
    const ABC: [u8; 40] = sha1_hex(b"abc");
    const SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                          return redis.call('del', KEYS[1]) else return 0 end";
    const SCRIPT_SHA: [u8; 40] = sha1_hex(SCRIPT.as_bytes());

    #[test]
    fn known_vectors() {
        assert_eq!(&EMPTY, b"da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(&ABC, b"a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(
            &sha1_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            b"84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            &sha1_hex(
                b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn\
                  hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"
            ),
            b"a49b2446a02c645bf419f995b67091253a04a259"
        );
        assert_eq!(
            &sha1_hex(b"The quick brown fox jumps over the lazy dog"),
            b"2fd4e1c67a2d28fced849ee1bb76e7391b93eb12"
        );
    }

    #[test]
    fn million_a() {
        let data = vec![b'a'; 1_000_000];
        assert_eq!(
            &sha1_hex(&data),
            b"34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }

    #[test]
    fn padding_boundaries() {
        // Lengths around the one-block/two-block padding switch (55/56) and
        // block multiples must agree between compile time and run time and
        // produce distinct digests.
        const A55: [u8; 40] = sha1_hex(&[b'a'; 55]);
        const A56: [u8; 40] = sha1_hex(&[b'a'; 56]);
        const A64: [u8; 40] = sha1_hex(&[b'a'; 64]);
        assert_eq!(&A55, b"c1c8bbdc22796e28c0e15163d20899b65621d65a");
        assert_eq!(&A56, b"c2db330f6083854c99d4b5bfb6e8f29f201be699");
        assert_eq!(&A64, b"0098ba824b5c16427bd7a1122a5a442a25ec644d");
        assert_eq!(sha1_hex(&[b'a'; 55]), A55);
        assert_eq!(sha1_hex(&[b'a'; 64]), A64);
    }

    #[test]
    fn script_digest_is_const() {
        assert_eq!(sha1_hex(SCRIPT.as_bytes()), SCRIPT_SHA);
        assert!(SCRIPT_SHA
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)));
    }
}
