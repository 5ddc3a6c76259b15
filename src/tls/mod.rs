//! TLS for `rediss://` nodes: what the builder was told (CA files, a client certificate), and,
//! with the `tls` feature, the rustls client configuration made from it once per client, and
//! what a failed handshake means.
//!
//! A connection's session ([`session`], with the `tls` feature) runs its handshake, encrypts
//! and decrypts without a system call of its own: rustls is sans-IO, so it takes the bytes the
//! driver's non-blocking socket reads and gives those to write, on the same poll as every other
//! connection; the driver only moves the ciphertext. [`hello`] holds the bytes of the probe
//! that tells a TLS port from a plaintext one.
#![forbid(unsafe_code)]

pub(crate) mod hello;
#[cfg(feature = "tls")]
pub(crate) mod session;

use std::path::PathBuf;

#[cfg(not(feature = "tls"))]
use crate::error::InvalidArgument;

/// The TLS settings of a [`ClientBuilder`](crate::ClientBuilder).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// PEM files of CA certificates trusted besides the system's roots.
    pub ca_files: Vec<PathBuf>,
    /// A client certificate chain and its private key, PEM files.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    /// Whether anything was set.
    pub fn is_set(&self) -> bool {
        !self.ca_files.is_empty() || self.client_cert.is_some()
    }
}

/// Without the `tls` feature, there is no TLS configuration to hold.
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub(crate) enum TlsContext {}

/// Without the `tls` feature there is no session to start, and no node is `rediss://`.
#[cfg(not(feature = "tls"))]
pub(crate) fn session_for(
    _tls: Option<&TlsContext>,
    _node_tls: bool,
    _name: &str,
) -> Result<Option<std::convert::Infallible>, crate::error::NodeErrorKind> {
    Ok(None)
}

/// What a client without the `tls` feature says to TLS settings: none may be set.
#[cfg(not(feature = "tls"))]
pub(crate) fn unavailable(options: &TlsOptions) -> Result<Option<TlsContext>, InvalidArgument> {
    if options.is_set() {
        let name = if options.ca_files.is_empty() {
            "tls_client_cert"
        } else {
            "tls_ca_file"
        };
        return Err(InvalidArgument::BadOption {
            name,
            reason: "TLS needs redlock-mux built with its `tls` feature",
        });
    }
    Ok(None)
}

#[cfg(feature = "tls")]
pub(crate) use with_rustls::*;

#[cfg(feature = "tls")]
mod with_rustls {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::client::ClientConnection;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore};

    use super::TlsOptions;
    use crate::error::{InvalidArgument, NodeErrorKind, TlsFailure};

    /// A client's TLS configuration: the roots it trusts and the certificate it shows.
    #[derive(Debug, Clone)]
    pub(crate) struct TlsContext {
        config: Arc<ClientConfig>,
    }

    fn bad_file(path: &Path, reason: impl std::fmt::Display) -> InvalidArgument {
        InvalidArgument::BadTlsFile {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, InvalidArgument> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad_file(path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad_file(path, e))?;
        if certs.is_empty() {
            return Err(bad_file(path, "holds no PEM certificate"));
        }
        Ok(certs)
    }

    impl TlsContext {
        /// The system's roots, the CAs of `options`, and its client certificate: every file is
        /// read now, once, and a file that cannot be used is an [`InvalidArgument`].
        pub fn new(options: &TlsOptions) -> Result<TlsContext, InvalidArgument> {
            let mut roots = RootCertStore::empty();
            // A store that cannot be read leaves only the CAs given: a certificate that none of
            // them issued then fails to verify, which says what is wrong.
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            for path in &options.ca_files {
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|e| bad_file(path, e))?;
                }
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|_| InvalidArgument::BadOption {
                    name: "tls",
                    reason: "no TLS protocol version in common with the crypto provider",
                })?
                .with_root_certificates(roots);
            let config = match &options.client_cert {
                None => builder.with_no_client_auth(),
                Some((cert, key)) => {
                    let chain = certificates(cert)?;
                    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad_file(key, e))?;
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(|e| bad_file(cert, e))?
                }
            };
            Ok(TlsContext {
                config: Arc::new(config),
            })
        }

        /// A client session for `host` (a name, or an address, which the certificate must
        /// name), whose first bytes are its hello.
        pub fn connect(&self, host: &str) -> Result<ClientConnection, NodeErrorKind> {
            let name = ServerName::try_from(host.to_owned()).map_err(|_| {
                handshake_failed(TlsFailure::NameMismatch(format!(
                    "{host:?} is not a name a certificate can be checked against"
                )))
            })?;
            ClientConnection::new(self.config.clone(), name)
                .map_err(|e| handshake_failed(TlsFailure::Handshake(e.to_string())))
        }
    }

    /// The TLS session of a connect to a node (`node_tls`: a `rediss://` one) by the name
    /// `name`, with the client's configuration `tls`: none for a plaintext node, and never
    /// plaintext to a TLS node (the client is built with a TLS configuration whenever a node is
    /// one, so that error does not happen).
    pub(crate) fn session_for(
        tls: Option<&TlsContext>,
        node_tls: bool,
        name: &str,
    ) -> Result<Option<super::session::Session>, NodeErrorKind> {
        match (tls, node_tls) {
            (Some(tls), true) => tls
                .connect(name)
                .map(|s| Some(super::session::Session::new(s))),
            (None, true) => Err(handshake_failed(TlsFailure::Handshake(
                "no TLS configuration".into(),
            ))),
            (_, false) => Ok(None),
        }
    }

    /// A TLS failure of the handshake: a configuration error (see [`NodeErrorKind::Tls`]).
    pub(crate) fn handshake_failed(why: TlsFailure) -> NodeErrorKind {
        NodeErrorKind::Setup {
            command: "TLS",
            cause: Box::new(NodeErrorKind::Tls(why)),
        }
    }

    /// What a rustls error means for the node. In the handshake, every error is a configuration
    /// error, as is an alert about our certificate after it (a TLS 1.3 server judges the
    /// client's certificate once the client has finished its part); later, anything else is a
    /// broken connection.
    pub(crate) fn failure(e: rustls::Error, handshaking: bool) -> NodeErrorKind {
        use rustls::Error as E;
        let why = match e {
            E::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => TlsFailure::NameMismatch(e.to_string()),
            E::InvalidCertificate(_) | E::NoCertificatesPresented | E::UnsupportedNameType => {
                TlsFailure::Certificate(e.to_string())
            }
            E::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateRevoked
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnknownCA
                | AlertDescription::AccessDenied,
            ) => TlsFailure::ClientCertificate(e.to_string()),
            // Bytes that are no TLS record, in answer to the hello: not a TLS server.
            E::InvalidMessage(_) | E::InappropriateMessage { .. } if handshaking => {
                TlsFailure::NotTls
            }
            other if handshaking => TlsFailure::Handshake(other.to_string()),
            other => return NodeErrorKind::Tls(TlsFailure::Handshake(other.to_string())),
        };
        handshake_failed(why)
    }
}
