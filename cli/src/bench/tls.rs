//! `redlock-mux bench --tls`: the mutex over TLS next to the mutex over plaintext TCP, on the
//! same local servers (each listens on a plaintext port and on a TLS port), in alternating
//! blocks, at N = 1, 3 and 5. The certificates are throw-away ones, made with the `openssl`
//! command for this run: a CA, and a server certificate for 127.0.0.1.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use redlock_mux::Client;
use serde_json::json;

use super::phases::{
    ours_cycles, phases_json, print_detail_header, print_detail_rows, Kind, Phases,
};
use super::{Progress, BLOCK};
use crate::local_servers::{free_port, RedisServer};
use crate::stats::{fmt_duration, ratio, Fixed};
use crate::Fail;

/// A private directory with the run's certificates, removed when done.
struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    /// A CA and a server certificate for 127.0.0.1 and localhost (EC P-256, one day).
    fn make() -> Result<Pki, Fail> {
        let dir =
            std::env::temp_dir().join(format!("redlock-mux-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let pki = Pki { dir };
        let made = crate::pki::make_ca(&pki.dir, "bench CA", 1).and_then(|()| {
            crate::pki::sign(
                &pki.dir,
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
                1,
            )
        });
        made.map_err(|e| {
            Fail::other(format!(
                "bench --tls makes a throw-away certificate with the openssl command: {e}"
            ))
        })?;
        Ok(pki)
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// One local server with a plaintext port and a TLS port.
struct TlsServer {
    server: RedisServer,
    tls_port: u16,
}

/// Figures at one N: the mutex over plaintext and over TLS.
struct Row {
    n: usize,
    plain: Phases,
    tls: Phases,
}

/// Starts `n` servers (of `program`, or the default one) with a TLS port each, and measures.
pub fn run(
    program: Option<&Path>,
    n: usize,
    iters: usize,
    json: bool,
    progress: &Progress,
) -> Result<i32, Fail> {
    let pki = Pki::make()?;
    if !json {
        eprintln!("starting {n} local servers with a TLS port...");
    }
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        let port = free_port()?;
        let port_text = port.to_string();
        let (cert, key, ca) = (
            pki.file("server.crt"),
            pki.file("server.key"),
            pki.file("ca.crt"),
        );
        let args = [
            "--tls-port",
            &port_text,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ];
        let server = match program {
            Some(p) => RedisServer::start_program(p, &args),
            None => RedisServer::start_with(&args),
        }
        .map_err(|e| {
            Fail::other(format!(
                "could not start a server with a TLS port (is it built with TLS?): {e}"
            ))
        })?;
        servers.push(TlsServer {
            server,
            tls_port: port,
        });
    }
    let name = super::server_name(&servers[0].server.url());
    let origin = format!("{n} local {name} instances");
    if !json {
        eprintln!("started {origin}");
    }
    let mut rows = Vec::new();
    for &size in &super::sizes(n) {
        let plain: Vec<String> = servers[..size].iter().map(|s| s.server.url()).collect();
        let tls: Vec<String> = servers[..size]
            .iter()
            .map(|s| format!("rediss://127.0.0.1:{}", s.tls_port))
            .collect();
        rows.push(measure(&plain, &tls, &pki.file("ca.crt"), iters, progress)?);
    }
    progress.clear();
    let mut out = io::stdout().lock();
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter_mut()
            .map(|r| {
                json!({
                    "n": r.n,
                    "plaintext": phases_json(&mut r.plain),
                    "tls": phases_json(&mut r.tls),
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            json!({ "origin": origin, "iters": iters, "tls": rows })
        )?;
    } else {
        print(&mut out, &origin, iters, &mut rows)?;
    }
    out.flush()?;
    Ok(0)
}

fn measure(
    plain: &[String],
    tls: &[String],
    ca: &str,
    iters: usize,
    progress: &Progress,
) -> Result<Row, Fail> {
    let n = plain.len();
    let build = |urls: &[String]| {
        Client::builder()
            .nodes(urls)
            .tls_ca_file(ca)
            .build()
            .map_err(|e| Fail::other(format!("bad nodes: {e}")))
    };
    let (plain_client, tls_client) = (build(plain)?, build(tls)?);
    let (plain_key, tls_key) = (
        format!("redlock-mux:bench:plain:{n}"),
        format!("redlock-mux:bench:tls:{n}"),
    );
    let mut row = Row {
        n,
        plain: Phases::with_capacity(iters),
        tls: Phases::with_capacity(iters),
    };
    let mut scratch = Phases::default();
    let warmup = (iters / 10).clamp(100, 2000);
    ours_cycles(&plain_client, Kind::Mutex, &plain_key, warmup, &mut scratch);
    ours_cycles(&tls_client, Kind::Mutex, &tls_key, warmup, &mut scratch);
    let (mut done, mut block) = (0, 0usize);
    while done < iters {
        let count = BLOCK.min(iters - done);
        if block % 2 == 0 {
            ours_cycles(
                &plain_client,
                Kind::Mutex,
                &plain_key,
                count,
                &mut row.plain,
            );
            ours_cycles(&tls_client, Kind::Mutex, &tls_key, count, &mut row.tls);
        } else {
            ours_cycles(&tls_client, Kind::Mutex, &tls_key, count, &mut row.tls);
            ours_cycles(
                &plain_client,
                Kind::Mutex,
                &plain_key,
                count,
                &mut row.plain,
            );
        }
        done += count;
        block += 1;
        progress.show(&format!("tls N={n}"), done, iters);
    }
    Ok(row)
}

fn print(out: &mut dyn Write, origin: &str, iters: usize, rows: &mut [Row]) -> io::Result<()> {
    writeln!(
        out,
        "mutex over TLS next to plaintext TCP: {origin}; {iters} cycles per client per N, in \
         alternating blocks of {BLOCK}"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>2}  {:<8} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
        "N", "op", "tls p50", "plain p50", "ratio", "tls p99", "plain p99", "ratio"
    )?;
    for r in rows.iter_mut() {
        for (op, tls, plain) in [
            ("acquire", &mut r.tls.acquire, &mut r.plain.acquire),
            ("cycle", &mut r.tls.cycle, &mut r.plain.cycle),
        ] {
            let (t50, p50) = (tls.quantile(0.5), plain.quantile(0.5));
            let (t99, p99) = (tls.quantile(0.99), plain.quantile(0.99));
            writeln!(
                out,
                "{:>2}  {:<8} {:>10} {:>10} {:>6.3}x   {:>10} {:>10} {:>6.3}x",
                r.n,
                op,
                fmt_duration(t50),
                fmt_duration(p50),
                Fixed(ratio(t50, p50)),
                fmt_duration(t99),
                fmt_duration(p99),
                Fixed(ratio(t99, p99)),
            )?;
        }
    }
    writeln!(out)?;
    print_detail_header(out, "client")?;
    for r in rows.iter_mut() {
        print_detail_rows(out, r.n, "plain", &mut r.plain)?;
        print_detail_rows(out, r.n, "tls", &mut r.tls)?;
    }
    Ok(())
}
