//! TLS for the command's own blocking connections (`inspect`'s reads of each node), with the
//! `tls` feature: the roots and client certificate as the library takes them (the system's
//! roots and `--tls-ca`, `--tls-cert` with `--tls-key`), over rustls with the ring provider.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::args::TlsFiles;

/// A refusal (a certificate, a key or a name that does not do, a failed verification): an
/// error of kind `InvalidData`, which the caller reports as refused, where an I/O error of
/// any other kind means the server was not reached.
fn refused(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

/// The client configuration for `files`.
fn config(files: &TlsFiles) -> io::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    for path in &files.ca {
        for cert in CertificateDer::pem_file_iter(path)
            .map_err(|e| refused(format!("{}: {e}", path.display())))?
        {
            let cert = cert.map_err(|e| refused(format!("{}: {e}", path.display())))?;
            roots
                .add(cert)
                .map_err(|e| refused(format!("{}: {e}", path.display())))?;
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(refused)?
            .with_root_certificates(roots);
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| refused(format!("{}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| refused(format!("{}: {e}", key.display())))?;
            builder.with_client_auth_cert(chain, key).map_err(refused)
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// `stream` to `host`, its handshake done: the server's certificate verified for `host`.
/// A refusal is an error of kind `InvalidData`.
pub fn wrap(
    mut stream: TcpStream,
    host: &str,
    files: &TlsFiles,
) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = ServerName::try_from(host.to_owned()).map_err(refused)?;
    let mut session = ClientConnection::new(Arc::new(config(files)?), name).map_err(refused)?;
    while session.is_handshaking() {
        session
            .complete_io(&mut stream)
            .map_err(|e| match e.kind() {
                io::ErrorKind::InvalidData => refused(e),
                _ => e,
            })?;
    }
    Ok(StreamOwned::new(session, stream))
}
