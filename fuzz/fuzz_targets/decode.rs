//! Decodes arbitrary bytes as a stream of RESP2 replies. Decoding must never
//! panic, every reply it yields must survive an encode/decode round trip, and
//! `scan` (which only finds where a reply ends) must agree with `decode` on
//! every input: the same length, the same partial input, the same error. Decoding into
//! arrays kept and taken back between replies (`Arrays`) must give what `decode` gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redlock_mux::resp::{decode, scan, Arrays, Limits, Status};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    let mut buf = Vec::new();
    let mut arrays = Arrays::default();
    loop {
        let decoded = decode(rest, &limits);
        let kept = arrays.decode(rest, &limits);
        assert_eq!(kept, decoded, "decoding into kept arrays differs");
        if let Ok(Status::Complete((reply, _))) = kept {
            arrays.reclaim(reply);
        }
        let scanned = scan(rest, &limits);
        match (&decoded, &scanned) {
            (Ok(Status::Complete((_, used))), Ok(Status::Complete(n))) => assert_eq!(used, n),
            (Ok(Status::Partial), Ok(Status::Partial)) => {}
            (Err(a), Err(b)) => assert_eq!(a, b),
            other => panic!("scan and decode disagree: {other:?}"),
        }
        let Ok(Status::Complete((reply, used))) = decoded else {
            break;
        };
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
