//! Command-line parsing by hand: `--name value`, `--name=value`, switches, positionals, and
//! durations written like `250ms`, `10s` or `2m`.
#![forbid(unsafe_code)]

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

/// Shorthand for building a [`UsageError`] with `format!` syntax.
macro_rules! usage {
    ($($t:tt)*) => { $crate::args::UsageError(format!($($t)*)) };
}
pub(crate) use usage;

/// What one command accepts: options that take a value, and switches that do not.
pub struct Spec {
    /// Options that take a value, without the leading `--`.
    pub options: &'static [&'static str],
    /// Switches, without the leading `--`.
    pub switches: &'static [&'static str],
    /// Whether `--` ends the options and everything after it is kept apart.
    pub takes_command: bool,
}

/// The parsed command line of one command.
#[derive(Debug, Default)]
pub struct Parsed {
    options: Vec<(&'static str, String)>,
    switches: Vec<&'static str>,
    /// Arguments that are not options, in order.
    pub positional: Vec<String>,
    /// Everything after `--`, when the command takes a command.
    pub command: Vec<String>,
    /// Whether `--help` or `-h` was given.
    pub help: bool,
}

impl Parsed {
    /// The last value given for option `name`.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether switch `name` was given.
    pub fn switch(&self, name: &str) -> bool {
        self.switches.contains(&name)
    }

    /// The one positional argument, KEY.
    pub fn key(&self) -> Result<String, UsageError> {
        match self.positional.as_slice() {
            [key] => Ok(key.clone()),
            [] => Err(usage!("no KEY given")),
            [_, extra, ..] => Err(usage!(
                "unexpected argument {extra:?} (a command goes after `--`)"
            )),
        }
    }

    /// Option `name` as a duration, or `default`.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, UsageError> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => parse_duration(v).map_err(|e| usage!("--{name}: {e}")),
        }
    }

    /// Option `name` as a positive integer, or `default`.
    pub fn count(&self, name: &str, default: usize) -> Result<usize, UsageError> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(usage!("--{name}: expected a positive integer, got {v:?}")),
            },
        }
    }
}

/// Parses a command's arguments; on `--help`, prints `help` and returns `None`.
pub fn parse_command(
    spec: &Spec,
    args: &[String],
    help: &str,
) -> Result<Option<Parsed>, UsageError> {
    let parsed = parse(spec, args)?;
    if parsed.help {
        print!("{help}");
        return Ok(None);
    }
    Ok(Some(parsed))
}

/// Parses `args` (without the program and command names) against `spec`.
pub fn parse(spec: &Spec, args: &[String]) -> Result<Parsed, UsageError> {
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" && spec.takes_command {
            parsed.command = args[i..].to_vec();
            break;
        }
        if arg == "--help" || arg == "-h" {
            parsed.help = true;
            continue;
        }
        let Some(body) = arg.strip_prefix("--") else {
            if arg.len() > 1 && arg.starts_with('-') {
                return Err(usage!("unknown option {arg:?}"));
            }
            parsed.positional.push(arg.clone());
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (body, None),
        };
        if let Some(&name) = spec.options.iter().find(|&&o| o == name) {
            let value = match inline {
                Some(v) => v,
                None if i < args.len() => {
                    i += 1;
                    args[i - 1].clone()
                }
                None => return Err(usage!("--{name} needs a value")),
            };
            parsed.options.push((name, value));
        } else if let Some(&name) = spec.switches.iter().find(|&&s| s == name) {
            if inline.is_some() {
                return Err(usage!("--{name} takes no value"));
            }
            parsed.switches.push(name);
        } else {
            return Err(usage!("unknown option --{name}"));
        }
    }
    Ok(parsed)
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

/// The node URLs from `--nodes`, else from `REDLOCK_NODES`, as comma-separated URLs.
pub fn nodes(parsed: &Parsed) -> Result<Vec<String>, UsageError> {
    let list = match parsed.value("nodes") {
        Some(v) => v.to_owned(),
        None => std::env::var("REDLOCK_NODES")
            .map_err(|_| usage!("no nodes: pass --nodes URL,URL,... or set REDLOCK_NODES"))?,
    };
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(usage!("the node list {list:?} is empty"));
    }
    Ok(urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
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
    fn options_switches_and_command() {
        let spec = Spec {
            options: &["ttl", "nodes"],
            switches: &["read"],
            takes_command: true,
        };
        let p = parse(
            &spec,
            &strings(&[
                "--ttl",
                "5s",
                "--read",
                "--nodes=a,b",
                "key",
                "--",
                "ls",
                "-l",
            ]),
        )
        .unwrap();
        assert_eq!(p.value("ttl"), Some("5s"));
        assert_eq!(p.value("nodes"), Some("a,b"));
        assert!(p.switch("read"));
        assert_eq!(p.positional, ["key"]);
        assert_eq!(p.command, ["ls", "-l"]);
        assert!(parse(&spec, &strings(&["--bogus"])).is_err());
        assert!(parse(&spec, &strings(&["--ttl"])).is_err());
        assert!(parse(&spec, &strings(&["--read=1"])).is_err());
    }
}
