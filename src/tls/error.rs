//! Why a TLS file could not be turned into a rustls config: typed, so a
//! caller can tell a file it could not read (an I/O error, worth retrying
//! after the operator fixes permissions) from a file that holds the wrong
//! thing, and each names the file at fault.

use rustls::pki_types::pem;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// What a PEM file was expected to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemKind {
    /// Certificates (`-----BEGIN CERTIFICATE-----`).
    Certificate,
    /// Revocation lists (`-----BEGIN X509 CRL-----`).
    RevocationList,
}

impl PemKind {
    fn file(self) -> &'static str {
        match self {
            PemKind::Certificate => "certificate file",
            PemKind::RevocationList => "revocation list file",
        }
    }

    fn missing(self) -> &'static str {
        match self {
            PemKind::Certificate => {
                "no certificate in it (expected a -----BEGIN CERTIFICATE----- block)"
            }
            PemKind::RevocationList => {
                "no revocation list in it (expected a -----BEGIN X509 CRL----- block)"
            }
        }
    }
}

/// Why [`ServerTls`](super::ServerTls) or [`ClientTls`](super::ClientTls)
/// could not be loaded.
#[derive(Debug)]
pub enum TlsFileError {
    /// The file could not be read (missing, unreadable, too large).
    Read {
        /// The file.
        path: PathBuf,
        /// The OS's answer.
        source: io::Error,
    },
    /// The file is not PEM of the expected kind.
    Pem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        kind: PemKind,
        /// What the PEM parser said.
        source: pem::Error,
    },
    /// The file is PEM but holds nothing of the expected kind.
    Empty {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        kind: PemKind,
    },
    /// The file holds no private key.
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        source: pem::Error,
    },
    /// A certificate of a CA file cannot be a trust anchor.
    BadCa {
        /// The CA file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The client certificate verifier could not be built from the CA
    /// and revocation lists.
    Verifier {
        /// The client CA file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::server::VerifierBuilderError,
    },
    /// The key does not go with the certificate (a node's).
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
        /// What rustls said (boxed: the error stays small).
        source: Box<rustls::Error>,
    },
    /// The client's certificate and key cannot be used together.
    ClientAuth {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said (boxed: the error stays small).
        source: Box<rustls::Error>,
    },
    /// A client certificate was given without its key.
    CertWithoutKey,
    /// A client key was given without its certificate.
    KeyWithoutCert,
    /// The name the node's certificate must carry is not a DNS name or
    /// an IP address.
    ServerName {
        /// The name given.
        name: String,
        /// What rustls said.
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

impl fmt::Display for TlsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFileError::Read { path, source } => write!(f, "{}: {source}", path.display()),
            TlsFileError::Pem { path, kind, source } => {
                write!(f, "{}: not a PEM {}: {source}", path.display(), kind.file())
            }
            TlsFileError::Empty { path, kind } => {
                write!(f, "{}: {}", path.display(), kind.missing())
            }
            TlsFileError::NoKey { path, source } => write!(
                f,
                "{}: no private key in it (expected a -----BEGIN PRIVATE KEY----- block): {source}",
                path.display()
            ),
            TlsFileError::BadCa { path, source } => {
                write!(
                    f,
                    "{}: not a usable CA certificate: {source}",
                    path.display()
                )
            }
            TlsFileError::Verifier { path, source } => write!(f, "{}: {source}", path.display()),
            TlsFileError::KeyMismatch { key, cert, source } => write!(
                f,
                "{} does not go with {}: {source}",
                key.display(),
                cert.display()
            ),
            TlsFileError::ClientAuth { cert, key, source } => {
                write!(f, "{} and {}: {source}", cert.display(), key.display())
            }
            TlsFileError::CertWithoutKey => {
                f.write_str("a client certificate needs its key (--key)")
            }
            TlsFileError::KeyWithoutCert => {
                f.write_str("a client key needs its certificate (--cert)")
            }
            TlsFileError::ServerName { name, .. } => {
                write!(f, "{name:?} is not a DNS name or IP address")
            }
        }
    }
}

impl std::error::Error for TlsFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsFileError::Read { source, .. } => Some(source),
            TlsFileError::Pem { source, .. } | TlsFileError::NoKey { source, .. } => Some(source),
            TlsFileError::BadCa { source, .. } => Some(source),
            TlsFileError::KeyMismatch { source, .. } | TlsFileError::ClientAuth { source, .. } => {
                Some(source.as_ref())
            }
            TlsFileError::Verifier { source, .. } => Some(source),
            TlsFileError::ServerName { source, .. } => Some(source),
            TlsFileError::Empty { .. }
            | TlsFileError::CertWithoutKey
            | TlsFileError::KeyWithoutCert => None,
        }
    }
}
