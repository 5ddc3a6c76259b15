//! RESP2 codec throughput: encoding commands and decoding replies, in ns per call and MB/s.
//!
//! `cargo bench --bench codec`

mod support;

use std::hint::black_box;

use redlock_mux::resp::{self, Limits, Status};
use support::{bench, header};

const KEY: &[u8] = b"invoice:4242";
const TOKEN: &[u8] = b"3f8a2c1e9b7d4f6a0c5e8b2d1f3a7c9e4b6d8f0a";

fn decode_all(input: &[u8], limits: &Limits) -> usize {
    let mut at = 0;
    while at < input.len() {
        match resp::decode(&input[at..], limits) {
            Ok(Status::Complete((reply, used))) => {
                black_box(&reply);
                at += used;
            }
            other => panic!("bench input did not decode: {other:?}"),
        }
    }
    at
}

fn main() {
    let limits = Limits::default();
    let mut out = Vec::with_capacity(64 * 1024);

    header("RESP encode");
    let set: [&[u8]; 6] = [b"SET", KEY, TOKEN, b"NX", b"PX", b"10000"];
    out.clear();
    resp::encode_command(&mut out, &set);
    let set_len = out.len();
    bench("encode_command SET key token NX PX", set_len, || {
        out.clear();
        resp::encode_command(&mut out, black_box(&set));
        black_box(&out);
    });
    let payload = vec![b'x'; 16 * 1024];
    let big: [&[u8]; 3] = [b"SET", KEY, &payload];
    bench(
        "encode_command SET key <16 KiB>",
        payload.len() + 40,
        || {
            out.clear();
            resp::encode_command(&mut out, black_box(&big));
            black_box(&out);
        },
    );
    bench("write_bulk_u64", 0, || {
        out.clear();
        resp::write_bulk_u64(&mut out, black_box(1_234_567_890));
        black_box(&out);
    });

    header("RESP decode");
    let cases: [(&str, Vec<u8>); 5] = [
        ("+OK (acquire granted)", b"+OK\r\n".to_vec()),
        ("$-1 (acquire refused)", b"$-1\r\n".to_vec()),
        (":1 (script result)", b":1\r\n".to_vec()),
        ("pub/sub message array", {
            let mut m = Vec::new();
            resp::encode_command(
                &mut m,
                &[b"message", b"redlock-mux:wake:invoice:4242", b"1"],
            );
            m
        }),
        ("16 KiB bulk (borrowed, no copy)", {
            let mut m = Vec::new();
            resp::write_bulk(&mut m, &payload);
            m
        }),
    ];
    for (name, input) in &cases {
        bench(&format!("decode {name}"), input.len(), || {
            black_box(decode_all(black_box(input), &limits));
        });
    }
    // Many small replies back to back, as a pipelined connection reads them.
    let mut stream = Vec::new();
    for i in 0..1000 {
        stream.extend_from_slice(if i % 3 == 0 { b"$-1\r\n" } else { b"+OK\r\n" });
    }
    bench("decode 1000 pipelined small replies", stream.len(), || {
        black_box(decode_all(black_box(&stream), &limits));
    });
}
