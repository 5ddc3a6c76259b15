//! What the commands share on their command lines: usage errors, durations, the node list.
//!
//! Parsing itself is `lexopt`'s (see Cargo.toml): each command matches its options in one
//! loop, so `--name value`, `--name=value`, `-n`, `-w 5`, `-w5` and `--` behave as in any
//! POSIX tool.

use std::fmt;
use std::time::Duration;

/// Exit status for a command-line usage error (sysexits `EX_USAGE`).
pub const EXIT_USAGE: i32 = 64;

/// A usage error, printed on stderr before exiting with [`EXIT_USAGE`].
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> UsageError {
        UsageError(e.to_string())
    }
}

/// Shorthand for building a [`UsageError`] with `format!` syntax.
macro_rules! usage {
    ($($t:tt)*) => { $crate::args::UsageError(format!($($t)*)) };
}
pub(crate) use usage;

/// The value of an option as UTF-8 text.
pub fn text(name: &str, value: std::ffi::OsString) -> Result<String, UsageError> {
    value
        .into_string()
        .map_err(|v| usage!("{name}: {v:?} is not valid UTF-8"))
}

/// Option `name`'s value as a duration written with a unit (`250ms`, `10s`, `2m`).
pub fn duration(name: &str, value: std::ffi::OsString) -> Result<Duration, UsageError> {
    parse_duration(&text(name, value)?).map_err(|e| usage!("{name}: {e}"))
}

/// Option `name`'s value as a duration with a unit, or as flock(1) takes its timeout: a bare
/// number of seconds, possibly with a fraction (`5`, `0.5`).
pub fn seconds(name: &str, value: std::ffi::OsString) -> Result<Duration, UsageError> {
    let text = text(name, value)?;
    let bare = !text.is_empty()
        && text.chars().all(|c| c.is_ascii_digit() || c == '.')
        && text.matches('.').count() <= 1
        && text != ".";
    if !bare {
        return parse_duration(&text).map_err(|e| usage!("{name}: {e}"));
    }
    // Whole seconds and a fraction, read as integers (to the nanosecond; finer digits are
    // dropped): parsing a float would bring the decimal-to-float tables into the command.
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let secs = match whole {
        "" => 0,
        whole => whole
            .parse::<u64>()
            .map_err(|_| usage!("{name}: {text:?} is too long (at most 8760h)"))?,
    };
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    let d = Duration::new(secs, nanos);
    if d > MAX_DURATION {
        return Err(usage!("{name}: {text:?} is too long (at most 8760h)"));
    }
    Ok(d)
}

/// Option `name`'s value as a positive integer.
pub fn count(name: &str, value: std::ffi::OsString) -> Result<usize, UsageError> {
    let text = text(name, value)?;
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(usage!("{name}: expected a positive integer, got {text:?}")),
    }
}

/// Parses a duration written as a whole number and a unit: `ms`, `s`, `m` or `h`
/// (`250ms`, `10s`, `2m`, `1h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; write it like 250ms, 10s or 2m"))?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let d = match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => {
            return Err(format!(
                "{text:?} has unknown unit {unit:?}; use ms, s, m or h"
            ))
        }
    };
    // Nothing this command waits for takes longer than a year; a cap keeps every deadline it
    // computes from overflowing the clock.
    d.filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| format!("{text:?} is too long (at most 8760h)"))
}

/// The longest duration any option takes: a year.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The TLS files of `rediss://` nodes: `--tls-ca FILE` (more than once), `--tls-cert FILE`
/// and `--tls-key FILE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates trusted besides the system's roots.
    pub ca: Vec<std::path::PathBuf>,
    /// A client certificate chain.
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's private key.
    pub key: Option<std::path::PathBuf>,
}

/// The help text of the TLS options, for every command that connects.
pub const TLS_HELP: &str = "\
  --tls-ca FILE        trust the CA certificates of this PEM file for rediss://
                       nodes, besides the system's (may be given more than once)
  --tls-cert FILE      client certificate (PEM) for nodes that ask for one
  --tls-key FILE       the client certificate's private key (PEM)
";

impl TlsFiles {
    /// Whether `--name` is one of the TLS options.
    pub fn takes(name: &str) -> bool {
        matches!(name, "tls-ca" | "tls-cert" | "tls-key")
    }

    /// Sets the TLS option `--name` (one that [`takes`](Self::takes)) to `value`.
    pub fn set(&mut self, name: &str, value: std::ffi::OsString) {
        match name {
            "tls-ca" => self.ca.push(value.into()),
            "tls-cert" => self.cert = Some(value.into()),
            _ => self.key = Some(value.into()),
        }
    }

    /// A certificate needs its key, and the key its certificate.
    pub fn check(&self) -> Result<(), UsageError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(usage!("--tls-cert needs --tls-key")),
            (None, Some(_)) => Err(usage!("--tls-key needs --tls-cert")),
            _ => Ok(()),
        }
    }

    /// The builder with these files.
    pub fn apply(&self, mut builder: redlock_mux::ClientBuilder) -> redlock_mux::ClientBuilder {
        for ca in &self.ca {
            builder = builder.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            builder = builder.tls_client_cert(cert, key);
        }
        builder
    }
}

/// Where the node list came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodesFrom {
    /// `--nodes`.
    Option,
    /// `REDLOCK_NODES`.
    Environment,
}

/// The node URLs from `--nodes` (`given`), else from `REDLOCK_NODES`; `None` when neither is
/// set. The list is comma-separated; each URL is the library's to read.
pub fn nodes_or_none(
    given: Option<String>,
) -> Result<Option<(Vec<String>, NodesFrom)>, UsageError> {
    let (list, from) = match given {
        Some(v) => (v, NodesFrom::Option),
        None => match std::env::var("REDLOCK_NODES") {
            Ok(v) => (v, NodesFrom::Environment),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(usage!("REDLOCK_NODES is not valid UTF-8"))
            }
        },
    };
    let urls = split_nodes(&list);
    if urls.is_empty() {
        return Err(usage!("the node list is empty"));
    }
    Ok(Some((urls, from)))
}

/// A comma-separated node list, read as URLs: a cluster's seeds and a Sentinel member's
/// sentinels are separated by commas too (`redis+cluster://a:1,b:2`,
/// `redis+sentinel://a:26379,b:26379/svc`), so a piece without a scheme that follows such a URL
/// whose host list is still open (no `/` or `?` after it yet) belongs to it. A bare `host:port`
/// node after a cluster URL is read as one of its seeds: write it `redis://host:port`. A comma
/// inside a query string (`?waitaof=1,0`) never splits nodes: a piece that is a number (with
/// more parameters after it, `0&db=1`) after a URL with a query is the rest of that query.
fn split_nodes(list: &str) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for piece in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let value = piece.split('&').next().unwrap_or("");
        let in_query = urls.last().is_some_and(|last| last.contains('?'))
            && !value.is_empty()
            && value.bytes().all(|b| b.is_ascii_digit());
        if let (true, Some(last)) = (in_query, urls.last_mut()) {
            last.push(',');
            last.push_str(piece);
            continue;
        }
        let open = urls.last().is_some_and(|last| {
            let lower = last.to_ascii_lowercase();
            let hosts = [
                "redis+cluster://",
                "rediss+cluster://",
                "redis+sentinel://",
                "rediss+sentinel://",
            ]
            .iter()
            .find_map(|scheme| lower.strip_prefix(scheme));
            hosts.is_some_and(|h| !h.contains(['/', '?']))
        });
        match urls.last_mut() {
            Some(last) if open && !piece.contains("://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.to_owned()),
        }
    }
    urls
}

/// The node URLs from `--nodes` (`given`), else from `REDLOCK_NODES`.
pub fn nodes(given: Option<String>) -> Result<Vec<String>, UsageError> {
    nodes_or_none(given)?
        .map(|(urls, _)| urls)
        .ok_or_else(|| usage!("no nodes: pass --nodes URL,URL,... or set REDLOCK_NODES"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_keep_the_hosts_of_one_member_together() {
        assert_eq!(
            split_nodes(
                "redis+sentinel://a:1,b:2,c:3/svc?wait=1, redis://d:4,e:5,\
                 redis+cluster://f:6,g:7,rediss+sentinel://h:8,i:9/s"
            ),
            [
                "redis+sentinel://a:1,b:2,c:3/svc?wait=1",
                "redis://d:4",
                "e:5",
                "redis+cluster://f:6,g:7",
                "rediss+sentinel://h:8,i:9/s"
            ]
        );
        assert_eq!(split_nodes(" a:1 ,, b:2 "), ["a:1", "b:2"]);
        assert_eq!(
            split_nodes("redis://a:1?waitaof=1,0,redis://b:2?db=1&waitaof=0,1&wait=1,c:3"),
            [
                "redis://a:1?waitaof=1,0",
                "redis://b:2?db=1&waitaof=0,1&wait=1",
                "c:3"
            ]
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("8761h").is_err());
        assert!(parse_duration("18446744073709551615s").is_err());
    }

    #[test]
    fn seconds_as_flock_takes_them() {
        let s = |t: &str| seconds("-w", t.into());
        assert_eq!(s("5").unwrap(), Duration::from_secs(5));
        assert_eq!(s("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(s("0").unwrap(), Duration::ZERO);
        assert_eq!(s("250ms").unwrap(), Duration::from_millis(250));
        assert!(s("").is_err());
        assert!(s(".").is_err());
        assert!(s("1.2.3").is_err());
        assert!(s("-1").is_err());
        assert!(s("99999999999").is_err());
        assert!(s("99999999999999999999999").is_err());
        assert_eq!(s(".25").unwrap(), Duration::from_millis(250));
        assert_eq!(s("2.").unwrap(), Duration::from_secs(2));
        assert_eq!(s("1.0000000019").unwrap(), Duration::new(1, 1));
        assert_eq!(s("31536000").unwrap(), MAX_DURATION);
        assert!(s("31536000.000000001").is_err());
    }
}
