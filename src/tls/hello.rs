//! The bytes of the probe that tells a TLS port from a plaintext one (see `Io::Probe`): a
//! ClientHello to send, and whether the first bytes of an answer are a TLS server's.
#![forbid(unsafe_code)]

/// A TLS 1.2 ClientHello that any TLS server answers, with a ServerHello or an alert: ECDHE
/// suites with AES-GCM, the common groups and signature schemes. Only the first bytes of the
/// answer are read.
pub(crate) fn client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x03]; // TLS 1.2
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // no session id
    let suites: [u16; 5] = [0xc02b, 0xc02f, 0xc02c, 0xc030, 0x1301];
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // groups: x25519, P-256
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // point formats: uncompressed
        0x00, 0x0d, 0x00, 0x0a, 0x00, 0x08, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x05,
        0x01, // signature schemes
    ];
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(extensions);
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// Whether `head`, the first two bytes of an answer to [`client_hello`], is a TLS server's: a
/// handshake record (0x16) or an alert (0x15), of TLS (major version 3).
pub(crate) fn answers_like_tls(head: [u8; 2]) -> bool {
    matches!(head, [0x15 | 0x16, 0x03])
}
