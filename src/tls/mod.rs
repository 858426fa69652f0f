//! TLS on the client protocol, with rustls (ring's cryptography, no
//! OpenSSL): the certificate and key files a node serves and a client
//! trusts, turned into rustls configs, and [`TlsChannel`], a rustls
//! connection driven by hand over a non-blocking socket, which the
//! daemon's event loops and the producer's connections use (the blocking
//! [`Client`](crate::client::Client) uses rustls' own `StreamOwned`).
//!
//! The files are read with a bound ([`PEM_FILE_BYTES_MAX`]) and checked
//! when they are loaded, so that a bad file is refused at start (or on a
//! reload, which then keeps the certificate in use) with the file named.

mod channel;
mod error;
mod files;
pub mod issue;
pub mod subject;

pub use channel::{looks_like_tls, tls_failure, TlsChannel};
pub use error::{PemKind, TlsFileError};
pub use files::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles, TlsFileRole, TlsVersion};

/// Bytes a PEM file (certificate chain, key or CA bundle) may hold at most.
pub const PEM_FILE_BYTES_MAX: u64 = 1 << 20;
