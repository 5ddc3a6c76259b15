//! Decodes arbitrary bytes as a stream of RESP2 replies. Decoding must never
//! panic, and every reply it yields must survive an encode/decode round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redlock_mux::resp::{decode, Limits, Status};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    let mut buf = Vec::new();
    while let Ok(Status::Complete((reply, used))) = decode(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        buf.clear();
        reply.encode(&mut buf);
        match decode(&buf, &limits) {
            Ok(Status::Complete((again, n))) => {
                assert_eq!(again, reply);
                assert_eq!(n, buf.len());
            }
            other => panic!("re-encoded reply did not decode: {other:?}"),
        }
        rest = &rest[used..];
    }
});
