//! Sans-IO codec for the Redis serialization protocol, version 2 (RESP2).
//!
//! This module speaks **RESP2 only**. A frame that starts with a RESP3 type
//! byte (`_ , # ! = ( | % ~ >`) is refused with [`DecodeError::Resp3`] rather
//! than misparsed; the connection layer is expected never to send `HELLO 3`.
//!
//! Decoding is zero-copy and incremental in the style of `httparse`:
//! [`decode`] looks at the front of a byte buffer and returns either a complete
//! [`Reply`] borrowing from that buffer together with the number of bytes it
//! consumed, or [`Status::Partial`] when more bytes are needed. It performs no
//! IO, keeps no state between calls and never panics on any input.
//!
//! Every length and depth is capped by [`Limits`]: bulk string sizes, array
//! element counts, array nesting depth and the length of line-based frames.
//! Memory reserved while decoding is bounded by the bytes actually present,
//! never by a length the peer merely claims.
//!
//! Encoding helpers ([`encode_command`], [`write_bulk`], ...) append to a
//! caller-owned, reusable `Vec<u8>` and format numbers by hand.
#![forbid(unsafe_code)]

use std::fmt;

/// A reply borrowed from the input buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// Simple string: `+OK\r\n` decodes to `Simple(b"OK")`.
    Simple(&'a [u8]),
    /// Error reply: `-ERR x\r\n` decodes to `Error(b"ERR x")`, the whole
    /// message including its leading kind word.
    Error(&'a [u8]),
    /// Integer reply: `:42\r\n`.
    Integer(i64),
    /// Bulk string; `None` is the null bulk string `$-1\r\n`.
    Bulk(Option<&'a [u8]>),
    /// Array; `None` is the null array `*-1\r\n`. Elements may themselves be
    /// arrays (up to [`Limits::max_depth`]) or errors.
    Array(Option<Vec<Reply<'a>>>),
}

/// An owned reply, with the same shape as [`Reply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Simple string (without the `+` and CRLF).
    Simple(Vec<u8>),
    /// Error message (without the `-` and CRLF).
    Error(Vec<u8>),
    /// Integer.
    Integer(i64),
    /// Bulk string; `None` is the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// Array; `None` is the null array.
    Array(Option<Vec<Value>>),
}

/// Outcome of a decode attempt that did not fail: either a complete item, or
/// a signal that the input ends before the item does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status<T> {
    /// A complete item was decoded.
    Complete(T),
    /// The input is a valid prefix so far; read more bytes and call again
    /// with the whole (extended) buffer.
    Partial,
}

/// Caps applied while decoding, so that a hostile or broken peer cannot make
/// the decoder allocate or recurse without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted bulk string payload, in bytes. Default: 16 MiB.
    pub max_bulk: usize,
    /// Largest accepted number of elements in one array. Default: `1 << 20`.
    pub max_array: usize,
    /// Deepest accepted array nesting; a top-level array is at depth 1.
    /// Default: 16.
    pub max_depth: usize,
    /// Longest accepted content of a simple string, error or integer line,
    /// in bytes, not counting the type byte and the CRLF. Default: 64 KiB.
    pub max_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 16 * 1024 * 1024,
            max_array: 1 << 20,
            max_depth: 16,
            max_line: 64 * 1024,
        }
    }
}

/// Why the front of a buffer is not a valid RESP2 reply.
///
/// Any of these means the stream is out of sync and the connection should be
/// dropped.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The type byte is not one of `+ - : $ *` (nor a RESP3 type byte).
    UnknownType(u8),
    /// The type byte belongs to RESP3 (`_ , # ! = ( | % ~ >`); only RESP2 is
    /// spoken.
    Resp3(u8),
    /// An integer or length line is not a valid decimal `i64`.
    BadInteger,
    /// A length is negative but not `-1`.
    BadLength,
    /// A line is terminated by something other than CRLF (e.g. a bare `\n`
    /// or a stray `\r`), or a bulk payload is not followed by CRLF.
    MissingCrlf,
    /// A bulk string is longer than [`Limits::max_bulk`].
    BulkTooLong {
        /// Length announced by the peer.
        len: u64,
        /// The cap in force.
        max: usize,
    },
    /// An array has more elements than [`Limits::max_array`].
    ArrayTooLong {
        /// Element count announced by the peer.
        len: u64,
        /// The cap in force.
        max: usize,
    },
    /// Arrays are nested deeper than [`Limits::max_depth`].
    TooDeep {
        /// The cap in force.
        max: usize,
    },
    /// A line runs past its cap without a CRLF: [`Limits::max_line`] for
    /// simple strings, errors and integers, [`MAX_LENGTH_LINE`] for bulk and
    /// array length lines.
    LineTooLong {
        /// The cap in force.
        max: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::UnknownType(b) => write!(f, "unknown RESP type byte 0x{b:02x}"),
            DecodeError::Resp3(b) => write!(
                f,
                "RESP3 type byte {:?} received; only RESP2 is supported",
                b as char
            ),
            DecodeError::BadInteger => f.write_str("malformed integer in RESP line"),
            DecodeError::BadLength => f.write_str("invalid negative length in RESP header"),
            DecodeError::MissingCrlf => f.write_str("RESP line or payload not terminated by CRLF"),
            DecodeError::BulkTooLong { len, max } => {
                write!(f, "bulk string of {len} bytes exceeds the limit of {max}")
            }
            DecodeError::ArrayTooLong { len, max } => {
                write!(f, "array of {len} elements exceeds the limit of {max}")
            }
            DecodeError::TooDeep { max } => {
                write!(f, "arrays nested deeper than the limit of {max}")
            }
            DecodeError::LineTooLong { max } => {
                write!(f, "RESP line longer than the limit of {max} bytes")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Cap on the content of a bulk or array length line (`$<len>` / `*<len>`):
/// 20 bytes, room for any `i64` including its sign.
pub const MAX_LENGTH_LINE: usize = 20;

/// Decodes one reply from the front of `input`.
///
/// Returns the reply and how many bytes it consumed, or [`Status::Partial`]
/// if `input` is a valid prefix that ends before the reply does. Bytes after
/// the reply are never examined. Never panics, and never reserves memory for
/// more array elements than the remaining input could possibly hold.
///
/// No state is kept across calls: after `Partial`, append the newly read
/// bytes and call again on the whole buffer, which re-parses the reply from
/// its start (cheap for the small replies of lock commands; bounded overall
/// by [`Limits`]).
pub fn decode<'a>(
    input: &'a [u8],
    limits: &Limits,
) -> Result<Status<(Reply<'a>, usize)>, DecodeError> {
    decode_with(input, limits, &mut Vec::new())
}

/// Storage for the arrays of decoded replies, owned by the caller (as `httparse` has its caller
/// own the storage of a request's headers).
///
/// [`Arrays::decode`] decodes exactly as [`decode`] does, but builds the reply's arrays in
/// vectors taken from here, and [`Arrays::reclaim`] takes them back once the reply is done
/// with. A caller that decodes its replies one after another through the same `Arrays`, handing
/// each back, allocates nothing for their arrays once its spare vectors have grown to the
/// replies' sizes. What it keeps is bounded: at most [`Arrays::MAX_SPARE`] vectors of at most
/// [`Arrays::MAX_SPARE_ITEMS`] items each; larger arrays are freed as `decode`'s are.
///
/// ```
/// use redlock_mux::resp::{Arrays, Limits, Reply, Status};
///
/// let mut arrays = Arrays::default();
/// let limits = Limits::default();
/// for _ in 0..3 {
///     let Ok(Status::Complete((reply, used))) = arrays.decode(b"*2\r\n+OK\r\n:0\r\n", &limits) else {
///         unreachable!()
///     };
///     assert_eq!(used, 13);
///     assert_eq!(reply, Reply::Array(Some(vec![Reply::Simple(b"OK"), Reply::Integer(0)])));
///     arrays.reclaim(reply); // the next decode reuses its vector
/// }
/// assert_eq!(arrays.spare(), 1);
/// ```
#[derive(Debug, Default)]
pub struct Arrays {
    /// Empty vectors, each with room for at most `MAX_SPARE_ITEMS` items. Empty, they hold no
    /// reply, so nothing ties them to any input's lifetime.
    spare: Vec<Vec<Reply<'static>>>,
}

impl Arrays {
    /// Most spare vectors kept.
    pub const MAX_SPARE: usize = 64;

    /// Largest capacity, in items, of a vector kept.
    pub const MAX_SPARE_ITEMS: usize = 64;

    /// Decodes one reply from the front of `input`, exactly as [`decode`] does (the same reply,
    /// length, `Partial` or error), building its arrays in spare vectors where there are.
    pub fn decode<'a>(
        &mut self,
        input: &'a [u8],
        limits: &Limits,
    ) -> Result<Status<(Reply<'a>, usize)>, DecodeError> {
        decode_with(input, limits, &mut self.spare)
    }

    /// Takes back the vectors of `reply`'s arrays (nested ones included), emptied, for later
    /// decodes; any beyond the bounds are freed.
    pub fn reclaim(&mut self, reply: Reply<'_>) {
        let Reply::Array(Some(mut items)) = reply else {
            return;
        };
        for item in items.drain(..) {
            self.reclaim(item);
        }
        if items.capacity() == 0
            || items.capacity() > Self::MAX_SPARE_ITEMS
            || self.spare.len() >= Self::MAX_SPARE
        {
            return;
        }
        // Empty, the vector holds nothing borrowed; collected in place (the item type keeps
        // its layout, only its lifetime changes) it keeps its allocation. The closure never
        // runs: there is no item left.
        let empty: Vec<Reply<'static>> = items.into_iter().map(|_| Reply::Integer(0)).collect();
        self.spare.push(empty);
    }

    /// How many spare vectors are kept.
    pub fn spare(&self) -> usize {
        self.spare.len()
    }
}

/// [`decode`], taking the arrays' vectors from `spare` while there are.
fn decode_with<'a>(
    input: &'a [u8],
    limits: &Limits,
    spare: &mut Vec<Vec<Reply<'static>>>,
) -> Result<Status<(Reply<'a>, usize)>, DecodeError> {
    match decode_at::<true>(input, 0, limits, 1, spare)? {
        Status::Complete((Some(reply), used)) => Ok(Status::Complete((reply, used))),
        // Building, decode_at always returns the reply.
        Status::Complete((None, _)) => Err(DecodeError::UnknownType(0)),
        Status::Partial => Ok(Status::Partial),
    }
}

/// Checks that `input` starts with one complete reply, exactly as [`decode`] would, and
/// returns its length, without building it: nothing is allocated, whatever the reply holds.
/// For code that only needs to know where a reply ends (to route its bytes, or to skip it).
///
/// ```
/// use redlock_mux::resp::{scan, Limits, Status};
///
/// let limits = Limits::default();
/// assert_eq!(scan(b"*2\r\n:1\r\n$-1\r\n+OK", &limits), Ok(Status::Complete(13)));
/// assert_eq!(scan(b"*2\r\n:1\r\n", &limits), Ok(Status::Partial));
/// ```
pub fn scan(input: &[u8], limits: &Limits) -> Result<Status<usize>, DecodeError> {
    Ok(
        match decode_at::<false>(input, 0, limits, 1, &mut Vec::new())? {
            Status::Complete((_, used)) => Status::Complete(used),
            Status::Partial => Status::Partial,
        },
    )
}

/// Shorthand for the internal "complete or partial" result.
type Step<T> = Result<Status<T>, DecodeError>;

/// Propagates `Partial` out of the enclosing function, like `?` for errors.
macro_rules! complete {
    ($e:expr) => {
        match $e? {
            Status::Complete(v) => v,
            Status::Partial => return Ok(Status::Partial),
        }
    };
}

/// Decodes the reply starting at `pos`; `depth` is the depth an array found
/// here would have. Returns the reply (if `BUILD`; otherwise it only checks
/// it, and allocates nothing) and the position just past it. Arrays are built
/// in vectors taken from `spare` while there are.
fn decode_at<'a, const BUILD: bool>(
    input: &'a [u8],
    pos: usize,
    limits: &Limits,
    depth: usize,
    spare: &mut Vec<Vec<Reply<'static>>>,
) -> Step<(Option<Reply<'a>>, usize)> {
    let Some(&ty) = input.get(pos) else {
        return Ok(Status::Partial);
    };
    let start = pos + 1;
    match ty {
        b'+' => {
            let (end, next) = complete!(find_line(input, start, limits.max_line));
            Ok(Status::Complete((
                Some(Reply::Simple(&input[start..end])),
                next,
            )))
        }
        b'-' => {
            let (end, next) = complete!(find_line(input, start, limits.max_line));
            Ok(Status::Complete((
                Some(Reply::Error(&input[start..end])),
                next,
            )))
        }
        b':' => {
            let (end, next) = complete!(find_line(input, start, limits.max_line));
            let n = parse_i64(&input[start..end]).ok_or(DecodeError::BadInteger)?;
            Ok(Status::Complete((Some(Reply::Integer(n)), next)))
        }
        b'$' => {
            let (len, body) = complete!(length_line(input, start));
            let Some(len) = len else {
                return Ok(Status::Complete((Some(Reply::Bulk(None)), body)));
            };
            if len > limits.max_bulk as u64 {
                return Err(DecodeError::BulkTooLong {
                    len,
                    max: limits.max_bulk,
                });
            }
            // len <= max_bulk <= usize::MAX, so the cast is lossless.
            let len = len as usize;
            let Some(body_end) = body.checked_add(len) else {
                return Ok(Status::Partial);
            };
            // Check the terminator as soon as its bytes are present.
            match input.get(body_end) {
                None => return Ok(Status::Partial),
                Some(b'\r') => {}
                Some(_) => return Err(DecodeError::MissingCrlf),
            }
            match input.get(body_end + 1) {
                None => Ok(Status::Partial),
                Some(b'\n') => Ok(Status::Complete((
                    Some(Reply::Bulk(Some(&input[body..body_end]))),
                    body_end + 2,
                ))),
                Some(_) => Err(DecodeError::MissingCrlf),
            }
        }
        b'*' => {
            let (len, mut next) = complete!(length_line(input, start));
            let Some(len) = len else {
                return Ok(Status::Complete((Some(Reply::Array(None)), next)));
            };
            if len > limits.max_array as u64 {
                return Err(DecodeError::ArrayTooLong {
                    len,
                    max: limits.max_array,
                });
            }
            if depth > limits.max_depth {
                return Err(DecodeError::TooDeep {
                    max: limits.max_depth,
                });
            }
            let len = len as usize;
            // Every element takes at least 3 bytes ("+\r\n"), so never
            // reserve more than the remaining input could hold.
            let remaining = input.len() - next;
            let room = len.min(remaining / 3);
            let mut items: Vec<Reply<'a>> = if !BUILD {
                Vec::new()
            } else if let Some(mut items) = spare.pop() {
                // An empty vector of replies borrowing nothing serves as one borrowing `input`.
                items.reserve(room);
                items
            } else {
                Vec::with_capacity(room)
            };
            for _ in 0..len {
                let (item, after) =
                    complete!(decode_at::<BUILD>(input, next, limits, depth + 1, spare));
                if BUILD {
                    items.extend(item);
                }
                next = after;
            }
            Ok(Status::Complete((
                BUILD.then_some(Reply::Array(Some(items))),
                next,
            )))
        }
        b'_' | b',' | b'#' | b'!' | b'=' | b'(' | b'|' | b'%' | b'~' | b'>' => {
            Err(DecodeError::Resp3(ty))
        }
        other => Err(DecodeError::UnknownType(other)),
    }
}

/// Finds the CRLF ending the line whose content starts at `start`.
///
/// Returns `(content_end, next)` where `next` is just past the CRLF. Content
/// longer than `max` bytes is refused as soon as `max + 1` content bytes are
/// present; a bare `\n` or a `\r` not followed by `\n` is `MissingCrlf`.
fn find_line(input: &[u8], start: usize, max: usize) -> Step<(usize, usize)> {
    let avail = input.get(start..).unwrap_or(&[]);
    let window = &avail[..avail.len().min(max.saturating_add(1))];
    match window.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(i) if window[i] == b'\n' => Err(DecodeError::MissingCrlf),
        Some(i) => match avail.get(i + 1) {
            None => Ok(Status::Partial),
            Some(b'\n') => Ok(Status::Complete((start + i, start + i + 2))),
            Some(_) => Err(DecodeError::MissingCrlf),
        },
        None if avail.len() > max => Err(DecodeError::LineTooLong { max }),
        None => Ok(Status::Partial),
    }
}

/// Parses a bulk/array length line starting at `start`: `None` for `-1`,
/// `Some(len)` for a non-negative length. Returns the position past the CRLF.
fn length_line(input: &[u8], start: usize) -> Step<(Option<u64>, usize)> {
    let (end, next) = complete!(find_line(input, start, MAX_LENGTH_LINE));
    let n = parse_i64(&input[start..end]).ok_or(DecodeError::BadInteger)?;
    match n {
        -1 => Ok(Status::Complete((None, next))),
        n if n < 0 => Err(DecodeError::BadLength),
        n => Ok(Status::Complete((Some(n as u64), next))),
    }
}

/// Strict decimal `i64`: an optional `-` then at least one ASCII digit,
/// nothing else, no overflow. Accumulates negatively so `i64::MIN` parses.
fn parse_i64(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() {
        return None;
    }
    let mut acc: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
    }
    if negative {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

impl<'a> Reply<'a> {
    /// Appends the RESP2 encoding of this reply to `out`.
    ///
    /// Decoding the output yields an equal reply, provided simple strings and
    /// errors contain no `\r` or `\n` (true of anything [`decode`] produced).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => write_line(out, b'+', s),
            Reply::Error(s) => write_line(out, b'-', s),
            Reply::Integer(n) => {
                out.push(b':');
                write_i64(out, *n);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => write_bulk(out, b),
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                write_array_len(out, items.len());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }

    /// Returns an owned copy of this reply.
    pub fn to_value(&self) -> Value {
        match self {
            Reply::Simple(s) => Value::Simple(s.to_vec()),
            Reply::Error(s) => Value::Error(s.to_vec()),
            Reply::Integer(n) => Value::Integer(*n),
            Reply::Bulk(b) => Value::Bulk(b.map(<[u8]>::to_vec)),
            Reply::Array(items) => Value::Array(
                items
                    .as_ref()
                    .map(|items| items.iter().map(Reply::to_value).collect()),
            ),
        }
    }

    /// The kind of server error, for [`Reply::Error`]; `None` for any other
    /// reply (errors nested inside an array are not looked at).
    pub fn error_kind(&self) -> Option<ServerErrorKind> {
        match self {
            Reply::Error(message) => Some(ServerErrorKind::of(message)),
            _ => None,
        }
    }
}

impl Value {
    /// Borrows this value as a [`Reply`] (arrays allocate a new `Vec`).
    pub fn as_reply(&self) -> Reply<'_> {
        match self {
            Value::Simple(s) => Reply::Simple(s),
            Value::Error(s) => Reply::Error(s),
            Value::Integer(n) => Reply::Integer(*n),
            Value::Bulk(b) => Reply::Bulk(b.as_deref()),
            Value::Array(items) => Reply::Array(
                items
                    .as_ref()
                    .map(|items| items.iter().map(Value::as_reply).collect()),
            ),
        }
    }

    /// Appends the RESP2 encoding of this value to `out`, exactly as
    /// [`Reply::encode`] would.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Simple(s) => write_line(out, b'+', s),
            Value::Error(s) => write_line(out, b'-', s),
            Value::Integer(n) => Reply::Integer(*n).encode(out),
            Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Value::Bulk(Some(b)) => write_bulk(out, b),
            Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(Some(items)) => {
                write_array_len(out, items.len());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }
}

fn write_line(out: &mut Vec<u8>, ty: u8, content: &[u8]) {
    out.reserve(content.len() + 3);
    out.push(ty);
    out.extend_from_slice(content);
    out.extend_from_slice(b"\r\n");
}

/// Formats `n` in decimal into the tail of `buf`, returning the digits.
fn fmt_u64(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = n;
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Formats `n` in decimal, with a leading `-` if negative.
fn fmt_i64(n: i64, buf: &mut [u8; 21]) -> &[u8] {
    let mut digits = [0u8; 20];
    let d = fmt_u64(n.unsigned_abs(), &mut digits);
    let start = buf.len() - d.len();
    buf[start..].copy_from_slice(d);
    if n < 0 {
        buf[start - 1] = b'-';
        &buf[start - 1..]
    } else {
        &buf[start..]
    }
}

fn write_i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(fmt_i64(n, &mut [0; 21]));
}

/// Number of bytes of a `<type><n>\r\n` header line.
fn header_size(n: usize) -> usize {
    let mut digits = 1;
    let mut n = n;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    1 + digits + 2
}

/// Number of bytes `write_bulk` produces for a payload of `len` bytes.
fn bulk_size(len: usize) -> usize {
    header_size(len) + len + 2
}

/// Appends a command as a RESP2 array of bulk strings: the form Redis
/// expects for every request.
///
/// Reserves the exact size up front, so `out` grows at most once and nothing
/// else is allocated.
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let total = header_size(args.len()) + args.iter().map(|a| bulk_size(a.len())).sum::<usize>();
    out.reserve(total);
    write_array_len(out, args.len());
    for arg in args {
        write_bulk(out, arg);
    }
}

/// Appends an array header, `*<n>\r\n`; the caller then writes `n` elements.
pub fn write_array_len(out: &mut Vec<u8>, n: usize) {
    let (line, start) = header_line(b'*', n);
    out.extend_from_slice(&line[start..]);
}

/// The line `<prefix><n>\r\n` (an array's or a bulk string's header), in `line[start..]`:
/// written in one copy rather than byte by byte.
fn header_line(prefix: u8, n: usize) -> ([u8; 24], usize) {
    let mut line = [0u8; 24];
    line[22] = b'\r';
    line[23] = b'\n';
    let mut i = 22;
    let mut n = n as u64;
    loop {
        i -= 1;
        line[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    i -= 1;
    line[i] = prefix;
    (line, i)
}

/// Appends a bulk string, `$<len>\r\n<arg>\r\n`.
pub fn write_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    let (line, start) = header_line(b'$', arg.len());
    let head = &line[start..];
    out.reserve(head.len() + arg.len() + 2);
    out.extend_from_slice(head);
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk string made of `parts` joined, without building the joined string first
/// (for derived names such as a prefix followed by a key).
pub fn write_bulk_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let (line, start) = header_line(b'$', len);
    let head = &line[start..];
    out.reserve(head.len() + len + 2);
    out.extend_from_slice(head);
    parts.iter().for_each(|p| out.extend_from_slice(p));
    out.extend_from_slice(b"\r\n");
}

/// Appends a bulk string holding the decimal digits of `n` (e.g. a `PX`
/// argument), without allocating.
pub fn write_bulk_u64(out: &mut Vec<u8>, n: u64) {
    write_bulk(out, fmt_u64(n, &mut [0; 20]));
}

/// Appends a bulk string holding the decimal form of `n`, with a leading `-`
/// when negative.
pub fn write_bulk_i64(out: &mut Vec<u8>, n: i64) {
    write_bulk(out, fmt_i64(n, &mut [0; 21]));
}

/// Class of a server error reply, from the first word of its message.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerErrorKind {
    /// `ERR`: generic error.
    Err,
    /// `NOSCRIPT`: `EVALSHA` with a digest the server has not cached.
    NoScript,
    /// `WRONGTYPE`: operation against a key holding the wrong kind of value.
    WrongType,
    /// `NOAUTH`: authentication required.
    NoAuth,
    /// `WRONGPASS`: invalid username/password pair.
    WrongPass,
    /// `LOADING`: the server is loading its dataset into memory.
    Loading,
    /// `READONLY`: write against a read-only replica.
    ReadOnly,
    /// `BUSY`: a script is running and blocking the server.
    Busy,
    /// `OOM`: command not allowed when used memory exceeds `maxmemory`.
    Oom,
    /// `NOPERM`: the ACL user lacks permission.
    NoPerm,
    /// `EXECABORT`: a transaction was discarded because of earlier errors.
    ExecAbort,
    /// `MASTERDOWN`: the replica lost its link with the master.
    MasterDown,
    /// `TRYAGAIN`: cluster resharding in progress.
    TryAgain,
    /// `MOVED`: cluster redirection; the slot lives on another node.
    Moved,
    /// `ASK`: cluster redirection during slot migration.
    Ask,
    /// `CLUSTERDOWN`: the cluster is down.
    ClusterDown,
    /// Any other first word (or an empty message).
    Other,
}

impl ServerErrorKind {
    /// Kind from an error message's first word, matched exactly and
    /// case-sensitively: `b"NOSCRIPT No matching script"` is
    /// [`NoScript`](ServerErrorKind::NoScript), `b"ERR ..."` is
    /// [`Err`](ServerErrorKind::Err); any unknown word is
    /// [`Other`](ServerErrorKind::Other).
    pub fn of(message: &[u8]) -> Self {
        let word = message.split(|&b| b == b' ').next().unwrap_or(&[]);
        match word {
            b"ERR" => Self::Err,
            b"NOSCRIPT" => Self::NoScript,
            b"WRONGTYPE" => Self::WrongType,
            b"NOAUTH" => Self::NoAuth,
            b"WRONGPASS" => Self::WrongPass,
            b"LOADING" => Self::Loading,
            b"READONLY" => Self::ReadOnly,
            b"BUSY" => Self::Busy,
            b"OOM" => Self::Oom,
            b"NOPERM" => Self::NoPerm,
            b"EXECABORT" => Self::ExecAbort,
            b"MASTERDOWN" => Self::MasterDown,
            b"TRYAGAIN" => Self::TryAgain,
            b"MOVED" => Self::Moved,
            b"ASK" => Self::Ask,
            b"CLUSTERDOWN" => Self::ClusterDown,
            _ => Self::Other,
        }
    }

    /// The error word this kind stands for (`"NOSCRIPT"`, `"ERR"`, ...);
    /// `"OTHER"` for [`Other`](ServerErrorKind::Other).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Err => "ERR",
            Self::NoScript => "NOSCRIPT",
            Self::WrongType => "WRONGTYPE",
            Self::NoAuth => "NOAUTH",
            Self::WrongPass => "WRONGPASS",
            Self::Loading => "LOADING",
            Self::ReadOnly => "READONLY",
            Self::Busy => "BUSY",
            Self::Oom => "OOM",
            Self::NoPerm => "NOPERM",
            Self::ExecAbort => "EXECABORT",
            Self::MasterDown => "MASTERDOWN",
            Self::TryAgain => "TRYAGAIN",
            Self::Moved => "MOVED",
            Self::Ask => "ASK",
            Self::ClusterDown => "CLUSTERDOWN",
            Self::Other => "OTHER",
        }
    }
}

impl fmt::Display for ServerErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_at_every_digit_count() {
        for n in [0usize, 9, 10, 99, 100, 12345, usize::MAX] {
            let mut out = Vec::new();
            write_array_len(&mut out, n);
            assert_eq!(out, format!("*{n}\r\n").as_bytes());
            if n <= 100 {
                let arg = vec![b'x'; n];
                let want = [format!("${n}\r\n").as_bytes(), &arg[..], b"\r\n"].concat();
                let mut out = Vec::new();
                write_bulk(&mut out, &arg);
                assert_eq!(out, want);
                let mut out = Vec::new();
                write_bulk_parts(&mut out, &[&arg[..n / 2], &arg[n / 2..]]);
                assert_eq!(out, want);
            }
        }
    }

    fn dec(input: &[u8]) -> Result<Status<(Reply<'_>, usize)>, DecodeError> {
        decode(input, &Limits::default())
    }

    fn complete(input: &[u8]) -> (Reply<'_>, usize) {
        match dec(input) {
            Ok(Status::Complete(c)) => c,
            other => panic!("expected Complete for {input:?}, got {other:?}"),
        }
    }

    fn err(input: &[u8]) -> DecodeError {
        match dec(input) {
            Err(e) => e,
            other => panic!("expected error for {input:?}, got {other:?}"),
        }
    }

    fn encoded(reply: &Reply<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        reply.encode(&mut out);
        out
    }

    #[test]
    fn simple_string() {
        assert_eq!(complete(b"+OK\r\n"), (Reply::Simple(b"OK"), 5));
        assert_eq!(complete(b"+\r\n"), (Reply::Simple(b""), 3));
        assert_eq!(complete(b"+OK\r\n+PONG\r\n"), (Reply::Simple(b"OK"), 5));
    }

    #[test]
    fn error_reply() {
        let (r, n) = complete(b"-ERR unknown command\r\n");
        assert_eq!(r, Reply::Error(b"ERR unknown command"));
        assert_eq!(n, 22);
        assert_eq!(r.error_kind(), Some(ServerErrorKind::Err));
        assert_eq!(Reply::Simple(b"ERR").error_kind(), None);
    }

    #[test]
    fn integers() {
        assert_eq!(complete(b":0\r\n").0, Reply::Integer(0));
        assert_eq!(complete(b":-0\r\n").0, Reply::Integer(0));
        assert_eq!(complete(b":42\r\n").0, Reply::Integer(42));
        assert_eq!(complete(b":-1\r\n").0, Reply::Integer(-1));
        assert_eq!(complete(b":007\r\n").0, Reply::Integer(7));
        assert_eq!(
            complete(b":9223372036854775807\r\n").0,
            Reply::Integer(i64::MAX)
        );
        assert_eq!(
            complete(b":-9223372036854775808\r\n").0,
            Reply::Integer(i64::MIN)
        );
    }

    #[test]
    fn bad_integers() {
        for bad in [
            &b":9223372036854775808\r\n"[..],
            b":-9223372036854775809\r\n",
            b":99999999999999999999999\r\n",
            b":\r\n",
            b":-\r\n",
            b":+5\r\n",
            b":--1\r\n",
            b":1a\r\n",
            b": 1\r\n",
            b":1 \r\n",
            b"$x\r\n",
            b"$\r\n",
            b"*1a\r\n",
            b"*+1\r\n",
        ] {
            assert_eq!(err(bad), DecodeError::BadInteger, "{bad:?}");
        }
    }

    #[test]
    fn bulk_strings() {
        assert_eq!(
            complete(b"$5\r\nhello\r\n"),
            (Reply::Bulk(Some(b"hello")), 11)
        );
        assert_eq!(complete(b"$0\r\n\r\n"), (Reply::Bulk(Some(b"")), 6));
        // Payload may contain CR, LF and anything else.
        assert_eq!(
            complete(b"$4\r\n\r\n\0\xff\r\n").0,
            Reply::Bulk(Some(b"\r\n\0\xff"))
        );
        assert_eq!(complete(b"$-1\r\n"), (Reply::Bulk(None), 5));
    }

    #[test]
    fn arrays() {
        assert_eq!(complete(b"*0\r\n"), (Reply::Array(Some(vec![])), 4));
        assert_eq!(complete(b"*-1\r\n"), (Reply::Array(None), 5));
        let input = b"*3\r\n:1\r\n$3\r\nfoo\r\n*2\r\n+a\r\n$-1\r\n";
        assert_eq!(
            complete(input),
            (
                Reply::Array(Some(vec![
                    Reply::Integer(1),
                    Reply::Bulk(Some(b"foo")),
                    Reply::Array(Some(vec![Reply::Simple(b"a"), Reply::Bulk(None)])),
                ])),
                input.len()
            )
        );
    }

    #[test]
    fn errors_nested_in_arrays_are_values() {
        let input = b"*3\r\n+OK\r\n-NOSCRIPT No matching script\r\n*1\r\n-BUSY x\r\n";
        let (r, n) = complete(input);
        assert_eq!(n, input.len());
        let Reply::Array(Some(items)) = &r else {
            panic!("{r:?}")
        };
        assert_eq!(items[1].error_kind(), Some(ServerErrorKind::NoScript));
        assert_eq!(items[2], Reply::Array(Some(vec![Reply::Error(b"BUSY x")])));
        // The array itself is not an error.
        assert_eq!(r.error_kind(), None);
    }

    #[test]
    fn partial_inputs() {
        for p in [
            &b""[..],
            b"+",
            b"+OK",
            b"+OK\r",
            b":12",
            b"$",
            b"$5",
            b"$5\r",
            b"$5\r\n",
            b"$5\r\nhel",
            b"$5\r\nhello",
            b"$5\r\nhello\r",
            b"*",
            b"*2\r\n",
            b"*2\r\n:1\r\n",
            b"*2\r\n*1\r\n",
        ] {
            assert_eq!(dec(p), Ok(Status::Partial), "{p:?}");
        }
    }

    #[test]
    fn unknown_and_resp3_types() {
        assert_eq!(err(b"?x\r\n"), DecodeError::UnknownType(b'?'));
        assert_eq!(err(b"OK\r\n"), DecodeError::UnknownType(b'O'));
        assert_eq!(err(b"\r\n"), DecodeError::UnknownType(b'\r'));
        for &t in b"_,#!=(|%~>" {
            assert_eq!(err(&[t]), DecodeError::Resp3(t));
            assert_eq!(err(&[t, b'1', b'\r', b'\n']), DecodeError::Resp3(t));
        }
        // Nested RESP3 frames are refused too.
        assert_eq!(err(b"*1\r\n_\r\n"), DecodeError::Resp3(b'_'));
        assert_eq!(err(b"*1\r\n%0\r\n"), DecodeError::Resp3(b'%'));
    }

    #[test]
    fn bad_lengths() {
        assert_eq!(err(b"$-2\r\n"), DecodeError::BadLength);
        assert_eq!(err(b"*-2\r\n"), DecodeError::BadLength);
        assert_eq!(err(b"$-9223372036854775808\r\n"), DecodeError::BadLength);
    }

    #[test]
    fn missing_crlf() {
        for bad in [
            &b"+OK\n"[..],
            b"+OK\rX\r\n",
            b"-ERR\n",
            b":1\n",
            b"$3\n",
            b"$3\r\nfooX",
            b"$3\r\nfoo\rX",
            b"$3\r\nfoo\n\r",
            b"$3\r\nfoobar\r\n",
            b"*1\n",
            b"*1\r\n+a\n",
        ] {
            assert_eq!(err(bad), DecodeError::MissingCrlf, "{bad:?}");
        }
    }

    #[test]
    fn bulk_cap() {
        let limits = Limits {
            max_bulk: 4,
            ..Limits::default()
        };
        assert!(matches!(
            decode(b"$4\r\nabcd\r\n", &limits),
            Ok(Status::Complete(_))
        ));
        // Refused from the header alone, before any payload arrives.
        assert_eq!(
            decode(b"$5\r\n", &limits),
            Err(DecodeError::BulkTooLong { len: 5, max: 4 })
        );
        assert_eq!(
            err(b"$9223372036854775807\r\n"),
            DecodeError::BulkTooLong {
                len: i64::MAX as u64,
                max: 16 * 1024 * 1024
            }
        );
    }

    #[test]
    fn array_cap() {
        let limits = Limits {
            max_array: 2,
            ..Limits::default()
        };
        assert!(matches!(
            decode(b"*2\r\n:1\r\n:2\r\n", &limits),
            Ok(Status::Complete(_))
        ));
        assert_eq!(
            decode(b"*3\r\n", &limits),
            Err(DecodeError::ArrayTooLong { len: 3, max: 2 })
        );
        assert_eq!(
            err(b"*9223372036854775807\r\n"),
            DecodeError::ArrayTooLong {
                len: i64::MAX as u64,
                max: 1 << 20
            }
        );
    }

    #[test]
    fn huge_array_header_reserves_little() {
        // A claim of 1M elements with only a few bytes present is Partial,
        // and the capacity reserved is bounded by the bytes present.
        let mut input = b"*1048576\r\n".to_vec();
        input.extend_from_slice(b":1\r\n:2\r\n");
        assert_eq!(dec(&input), Ok(Status::Partial));
    }

    fn nested(depth: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..depth {
            v.extend_from_slice(b"*1\r\n");
        }
        v.extend_from_slice(b":1\r\n");
        v
    }

    #[test]
    fn depth_cap() {
        let limits = Limits {
            max_depth: 3,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&nested(3), &limits),
            Ok(Status::Complete(_))
        ));
        assert_eq!(
            decode(&nested(4), &limits),
            Err(DecodeError::TooDeep { max: 3 })
        );
        // Detected from the headers alone.
        assert_eq!(
            decode(b"*1\r\n*1\r\n*1\r\n*1\r\n", &limits),
            Err(DecodeError::TooDeep { max: 3 })
        );
        let zero = Limits {
            max_depth: 0,
            ..Limits::default()
        };
        assert_eq!(
            decode(b"*0\r\n", &zero),
            Err(DecodeError::TooDeep { max: 0 })
        );
        assert!(matches!(decode(b":1\r\n", &zero), Ok(Status::Complete(_))));
        // Default: 16 levels fine, 17 refused; a very deep input cannot
        // exhaust the stack.
        assert!(matches!(dec(&nested(16)), Ok(Status::Complete(_))));
        assert_eq!(dec(&nested(17)), Err(DecodeError::TooDeep { max: 16 }));
        assert_eq!(dec(&nested(100_000)), Err(DecodeError::TooDeep { max: 16 }));
    }

    #[test]
    fn line_cap() {
        let limits = Limits {
            max_line: 4,
            ..Limits::default()
        };
        assert_eq!(
            decode(b"+abcd\r\n", &limits),
            Ok(Status::Complete((Reply::Simple(b"abcd"), 7)))
        );
        assert_eq!(decode(b"+abcd", &limits), Ok(Status::Partial));
        assert_eq!(decode(b"+abcd\r", &limits), Ok(Status::Partial));
        for bad in [&b"+abcde"[..], b"+abcde\r\n", b"-abcde", b":12345"] {
            assert_eq!(
                decode(bad, &limits),
                Err(DecodeError::LineTooLong { max: 4 }),
                "{bad:?}"
            );
        }
        // Length lines have their own fixed cap.
        let mut long = b"$".to_vec();
        long.extend_from_slice(&[b'1'; MAX_LENGTH_LINE + 1]);
        assert_eq!(
            dec(&long),
            Err(DecodeError::LineTooLong {
                max: MAX_LENGTH_LINE
            })
        );
        long[0] = b'*';
        assert_eq!(
            dec(&long),
            Err(DecodeError::LineTooLong {
                max: MAX_LENGTH_LINE
            })
        );
    }

    #[test]
    fn display_messages() {
        let all = [
            DecodeError::UnknownType(b'?'),
            DecodeError::Resp3(b'%'),
            DecodeError::BadInteger,
            DecodeError::BadLength,
            DecodeError::MissingCrlf,
            DecodeError::BulkTooLong { len: 9, max: 1 },
            DecodeError::ArrayTooLong { len: 9, max: 1 },
            DecodeError::TooDeep { max: 1 },
            DecodeError::LineTooLong { max: 1 },
        ];
        for e in all {
            let s = e.to_string();
            assert!(!s.is_empty());
            let _: &dyn std::error::Error = &e;
        }
        assert!(DecodeError::Resp3(b'%').to_string().contains("RESP3"));
    }

    #[test]
    fn default_limits() {
        let l = Limits::default();
        assert_eq!(l.max_bulk, 16 << 20);
        assert_eq!(l.max_array, 1 << 20);
        assert_eq!(l.max_depth, 16);
        assert_eq!(l.max_line, 64 << 10);
    }

    #[test]
    fn server_error_kinds() {
        use ServerErrorKind as K;
        let cases = [
            ("ERR unknown command", K::Err),
            ("NOSCRIPT No matching script. Please use EVAL.", K::NoScript),
            ("WRONGTYPE Operation against a key", K::WrongType),
            ("NOAUTH Authentication required.", K::NoAuth),
            ("WRONGPASS invalid username-password pair", K::WrongPass),
            ("LOADING Redis is loading the dataset in memory", K::Loading),
            (
                "READONLY You can't write against a read only replica.",
                K::ReadOnly,
            ),
            ("BUSY Redis is busy running a script.", K::Busy),
            ("OOM command not allowed", K::Oom),
            ("NOPERM this user has no permissions", K::NoPerm),
            ("EXECABORT Transaction discarded", K::ExecAbort),
            ("MASTERDOWN Link with MASTER is down", K::MasterDown),
            (
                "TRYAGAIN Multiple keys request during rehashing",
                K::TryAgain,
            ),
            ("MOVED 3999 127.0.0.1:6381", K::Moved),
            ("ASK 3999 127.0.0.1:6381", K::Ask),
            ("CLUSTERDOWN The cluster is down", K::ClusterDown),
            ("NOPERM", K::NoPerm),
            ("ERR", K::Err),
            ("", K::Other),
            ("err lowercase", K::Other),
            ("ERRX something", K::Other),
            ("BUSYGROUP Consumer Group name already exists", K::Other),
            ("WHATEVER", K::Other),
        ];
        for (msg, kind) in cases {
            assert_eq!(K::of(msg.as_bytes()), kind, "{msg}");
            if kind != K::Other {
                assert!(msg.starts_with(kind.as_str()));
                assert_eq!(K::of(kind.as_str().as_bytes()), kind);
            }
        }
        assert_eq!(K::Other.as_str(), "OTHER");
        assert_eq!(K::Moved.to_string(), "MOVED");
    }

    #[test]
    fn command_encoding() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"key", b"val", b"NX", b"PX", b"30000"]);
        assert_eq!(
            out,
            b"*6\r\n$3\r\nSET\r\n$3\r\nkey\r\n$3\r\nval\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
        );
        // Exact reservation: one growth, no slack needed.
        let mut exact = Vec::new();
        encode_command(&mut exact, &[b"GET", &[b'x'; 1234]]);
        assert_eq!(exact.len(), 4 + 9 + 7 + 1234 + 2);
        assert_eq!(exact.len(), header_size(2) + bulk_size(3) + bulk_size(1234));
        assert_eq!(exact.capacity(), exact.len());

        out.clear();
        encode_command(&mut out, &[]);
        assert_eq!(out, b"*0\r\n");

        out.clear();
        write_array_len(&mut out, 12);
        write_bulk(&mut out, b"");
        write_bulk_u64(&mut out, 0);
        write_bulk_u64(&mut out, u64::MAX);
        write_bulk_i64(&mut out, -42);
        write_bulk_i64(&mut out, i64::MIN);
        write_bulk_i64(&mut out, i64::MAX);
        assert_eq!(
            out,
            &b"*12\r\n$0\r\n\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n\
               $3\r\n-42\r\n$20\r\n-9223372036854775808\r\n\
               $19\r\n9223372036854775807\r\n"[..]
        );
    }

    #[test]
    fn encode_every_type() {
        assert_eq!(encoded(&Reply::Simple(b"OK")), b"+OK\r\n");
        assert_eq!(encoded(&Reply::Error(b"ERR x")), b"-ERR x\r\n");
        assert_eq!(encoded(&Reply::Integer(-7)), b":-7\r\n");
        assert_eq!(
            encoded(&Reply::Integer(i64::MIN)),
            b":-9223372036854775808\r\n"
        );
        assert_eq!(encoded(&Reply::Bulk(None)), b"$-1\r\n");
        assert_eq!(encoded(&Reply::Bulk(Some(b"ab"))), b"$2\r\nab\r\n");
        assert_eq!(encoded(&Reply::Array(None)), b"*-1\r\n");
        assert_eq!(
            encoded(&Reply::Array(Some(vec![
                Reply::Integer(1),
                Reply::Array(Some(vec![]))
            ]))),
            b"*2\r\n:1\r\n*0\r\n"
        );
    }

    #[test]
    fn value_conversions() {
        let input = b"*5\r\n+OK\r\n-ERR e\r\n:3\r\n$-1\r\n*2\r\n$1\r\nx\r\n*-1\r\n";
        let (r, _) = complete(input);
        let v = r.to_value();
        assert_eq!(
            v,
            Value::Array(Some(vec![
                Value::Simple(b"OK".to_vec()),
                Value::Error(b"ERR e".to_vec()),
                Value::Integer(3),
                Value::Bulk(None),
                Value::Array(Some(vec![
                    Value::Bulk(Some(b"x".to_vec())),
                    Value::Array(None)
                ])),
            ]))
        );
        assert_eq!(v.as_reply(), r);
        let mut out = Vec::new();
        v.encode(&mut out);
        assert_eq!(out, input);
    }

    /// Tiny deterministic xorshift64 PRNG for the property tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn bytes(&mut self, max_len: u64, line_safe: bool) -> Vec<u8> {
            let len = self.below(max_len + 1);
            (0..len)
                .map(|_| loop {
                    // Bias towards CR/LF so payloads exercise them.
                    let b = match self.below(8) {
                        0 => b'\r',
                        1 => b'\n',
                        _ => self.next() as u8,
                    };
                    if !(line_safe && (b == b'\r' || b == b'\n')) {
                        break b;
                    }
                })
                .collect()
        }

        fn value(&mut self, depth: usize) -> Value {
            let kinds = if depth >= 4 { 4 } else { 6 };
            match self.below(kinds) {
                0 => Value::Simple(self.bytes(8, true)),
                1 => Value::Error(self.bytes(12, true)),
                2 => Value::Integer(match self.below(6) {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    2 => 0,
                    3 => -1,
                    4 => self.below(1000) as i64 - 500,
                    _ => self.next() as i64,
                }),
                3 => {
                    if self.below(5) == 0 {
                        Value::Bulk(None)
                    } else {
                        Value::Bulk(Some(self.bytes(16, false)))
                    }
                }
                _ => {
                    if self.below(6) == 0 {
                        Value::Array(None)
                    } else {
                        let n = self.below(5);
                        Value::Array(Some((0..n).map(|_| self.value(depth + 1)).collect()))
                    }
                }
            }
        }
    }

    /// Several random values encoded back to back, with the end offset of
    /// each frame.
    fn random_stream(rng: &mut Rng) -> (Vec<Value>, Vec<u8>, Vec<usize>) {
        let count = 1 + rng.below(5) as usize;
        let values: Vec<Value> = (0..count).map(|_| rng.value(1)).collect();
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for v in &values {
            v.encode(&mut buf);
            ends.push(buf.len());
        }
        (values, buf, ends)
    }

    /// Decodes `buf` as a stream that arrives in chunks ending at each of
    /// `cuts` (then the rest), checking that every call returns Partial
    /// exactly when the next frame is not fully received, and Complete with
    /// the exact frame length otherwise.
    fn stream_decode(buf: &[u8], ends: &[usize], cuts: &[usize]) -> Vec<Value> {
        let limits = Limits::default();
        let mut received = 0;
        let mut pos = 0;
        let mut frame = 0;
        let mut out = Vec::new();
        let mut arrivals = cuts.iter().copied().chain(std::iter::once(buf.len()));
        while frame < ends.len() {
            match decode(&buf[pos..received], &limits).unwrap() {
                Status::Complete((reply, used)) => {
                    assert!(received >= ends[frame], "complete too early");
                    assert_eq!(pos + used, ends[frame], "wrong consumed count");
                    out.push(reply.to_value());
                    pos += used;
                    frame += 1;
                }
                Status::Partial => {
                    assert!(
                        received < ends[frame],
                        "Partial although frame {frame} is complete"
                    );
                    received = arrivals.next().expect("ran out of input").max(received);
                }
            }
        }
        assert_eq!(pos, buf.len());
        out
    }

    #[test]
    fn round_trip_split_at_every_boundary() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut total_bytes = 0;
        for _ in 0..300 {
            let (values, buf, ends) = random_stream(&mut rng);
            total_bytes += buf.len();
            for split in 0..=buf.len() {
                assert_eq!(stream_decode(&buf, &ends, &[split]), values);
            }
        }
        assert!(total_bytes > 10_000, "generator too timid: {total_bytes}");
    }

    #[test]
    fn one_byte_at_a_time() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        for _ in 0..300 {
            let (values, buf, ends) = random_stream(&mut rng);
            let cuts: Vec<usize> = (0..=buf.len()).collect();
            assert_eq!(stream_decode(&buf, &ends, &cuts), values);
        }
    }

    #[test]
    fn never_reads_past_the_frame() {
        let mut rng = Rng(42);
        for _ in 0..500 {
            let v = rng.value(1);
            let mut buf = Vec::new();
            v.encode(&mut buf);
            let len = buf.len();
            // Trailing garbage (even an invalid type byte) is left untouched.
            buf.extend_from_slice(b"\x00garbage");
            let (r, used) = complete(&buf);
            assert_eq!(used, len);
            assert_eq!(r.to_value(), v);
            // Every strict prefix is Partial.
            for cut in 0..len {
                assert_eq!(dec(&buf[..cut]), Ok(Status::Partial), "{v:?} cut {cut}");
            }
        }
    }

    /// The addresses of the vectors of `reply`'s arrays, sorted.
    fn array_storage(reply: &Reply<'_>, out: &mut Vec<usize>) {
        if let Reply::Array(Some(items)) = reply {
            out.push(items.as_ptr() as usize);
            items.iter().for_each(|item| array_storage(item, out));
        }
    }

    #[test]
    fn arrays_reuse_the_vectors_they_take_back() {
        let limits = Limits::default();
        let mut arrays = Arrays::default();
        // The shape of a native read lock's extend: an `EXEC` holding an array.
        let input = b"*3\r\n+OK\r\n*1\r\n:1\r\n*2\r\n$1\r\nx\r\n*-1\r\n";
        let mut first = None;
        for round in 0..4 {
            let got = arrays.decode(input, &limits);
            assert_eq!(got, decode(input, &limits));
            let Ok(Status::Complete((reply, used))) = got else {
                panic!("{got:?}");
            };
            assert_eq!(used, input.len());
            let mut storage = Vec::new();
            array_storage(&reply, &mut storage);
            storage.sort_unstable();
            arrays.reclaim(reply);
            assert_eq!(arrays.spare(), 3);
            // The first round allocates; the second may grow a vector taken for an array
            // larger than the one it held; from then on the same ones serve.
            match round {
                0 => {}
                1 => first = Some(storage),
                _ => assert_eq!(Some(&storage), first.as_ref(), "round {round}"),
            }
        }
        // A plain decode takes nothing from them.
        let _ = decode(input, &limits);
        assert_eq!(arrays.spare(), 3);
    }

    #[test]
    fn arrays_keep_a_bounded_store() {
        let limits = Limits::default();
        let mut arrays = Arrays::default();
        let mut big = b"*100\r\n".to_vec();
        (0..100).for_each(|_| big.extend_from_slice(b":1\r\n"));
        let Ok(Status::Complete((reply, _))) = arrays.decode(&big, &limits) else {
            panic!("big array");
        };
        arrays.reclaim(reply);
        assert_eq!(arrays.spare(), 0, "a vector over MAX_SPARE_ITEMS is freed");
        for _ in 0..2 * Arrays::MAX_SPARE {
            arrays.reclaim(Reply::Array(Some(vec![Reply::Integer(1)])));
        }
        assert_eq!(arrays.spare(), Arrays::MAX_SPARE);
        arrays.reclaim(Reply::Array(Some(Vec::new())));
        arrays.reclaim(Reply::Integer(1));
        arrays.reclaim(Reply::Array(None));
        assert_eq!(arrays.spare(), Arrays::MAX_SPARE);
    }

    #[test]
    fn arrays_decode_garbage_as_decode_does() {
        let mut rng = Rng(11);
        let limits = Limits {
            max_bulk: 64,
            max_array: 8,
            max_depth: 4,
            max_line: 32,
        };
        let mut arrays = Arrays::default();
        let alphabet = b"+-:$*\r\n0123456789-_%ab";
        for _ in 0..20_000 {
            let len = rng.below(40) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let got = arrays.decode(&input, &limits);
            assert_eq!(got, decode(&input, &limits), "{input:?}");
            if let Ok(Status::Complete((reply, _))) = got {
                arrays.reclaim(reply);
            }
        }
        for _ in 0..300 {
            let (values, buf, _) = random_stream(&mut rng);
            let mut rest = &buf[..];
            for v in values {
                let Ok(Status::Complete((reply, used))) = arrays.decode(rest, &Limits::default())
                else {
                    panic!("{v:?}");
                };
                assert_eq!(reply.to_value(), v);
                arrays.reclaim(reply);
                rest = &rest[used..];
            }
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut rng = Rng(7);
        let limits = Limits {
            max_bulk: 64,
            max_array: 8,
            max_depth: 4,
            max_line: 32,
        };
        let alphabet = b"+-:$*\r\n0123456789-_%ab";
        for _ in 0..20_000 {
            let len = rng.below(40) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            if let Ok(Status::Complete((r, used))) = decode(&input, &limits) {
                assert!(used <= input.len());
                let mut again = Vec::new();
                r.encode(&mut again);
                assert_eq!(
                    decode(&again, &limits),
                    Ok(Status::Complete((r, again.len())))
                );
            }
        }
    }
}
