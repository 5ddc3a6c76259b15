//! Throw-away certificates made with the `openssl` command, for TLS tests and `bench --tls`:
//! a CA, and certificates it signs, with EC P-256 keys. Files are written into `dir` as
//! `ca.crt`/`ca.key` and `NAME.crt`/`NAME.key`.

use std::io;
use std::path::Path;
use std::process::Command;

const KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

fn openssl(dir: &Path, args: &[&str]) -> io::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running openssl: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// A self-signed CA named `cn`, valid `days` days: `ca.crt` and `ca.key` in `dir`.
pub fn make_ca(dir: &Path, cn: &str, days: u32) -> io::Result<()> {
    let days = days.to_string();
    let subject = format!("/CN={cn}");
    let mut args = vec!["req", "-x509"];
    args.extend(KEY);
    args.extend([
        "-keyout", "ca.key", "-out", "ca.crt", "-days", &days, "-subj", &subject,
    ]);
    openssl(dir, &args)
}

/// A certificate `NAME.crt` (key `NAME.key`, subject `/CN=NAME`) signed by the CA in `dir`,
/// with the X.509 extensions `ext` (e.g. `subjectAltName=IP:127.0.0.1`), valid `days` days.
pub fn sign(dir: &Path, name: &str, ext: &str, days: u32) -> io::Result<()> {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(dir.join(&extfile), ext)?;
    let subject = format!("/CN={name}");
    let mut req = vec!["req"];
    req.extend(KEY);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
    openssl(dir, &req)?;
    let days = days.to_string();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            &days,
            "-extfile",
            &extfile,
        ],
    )
}
