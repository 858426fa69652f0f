//! The PEM files of the client protocol's TLS and the rustls configs made
//! of them: [`ServerTls`] for a node (certificate, key, and the CA that
//! client certificates must chain to, if mTLS is on; replaced whole on a
//! reload) and [`ClientTls`] for a client (the CA it trusts, and its own
//! certificate and key for mTLS).

use super::error::{PemKind, TlsFileError};
use super::PEM_FILE_BYTES_MAX;
use crate::io::private::read_capped;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The oldest TLS version a config accepts (`client.tls_min_version`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    V1_2,
    /// TLS 1.3 only (the default).
    #[default]
    V1_3,
}

impl TlsVersion {
    /// Parses `"1.2"` or `"1.3"`.
    pub fn parse(s: &str) -> Option<TlsVersion> {
        match s {
            "1.2" => Some(TlsVersion::V1_2),
            "1.3" => Some(TlsVersion::V1_3),
            _ => None,
        }
    }

    fn versions(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static BOTH: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            TlsVersion::V1_2 => &BOTH,
            TlsVersion::V1_3 => &TLS13_ONLY,
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsVersion::V1_2 => "1.2",
            TlsVersion::V1_3 => "1.3",
        })
    }
}

/// The ring provider: AES-GCM (AES-NI where the CPU has it) and
/// ChaCha20-Poly1305, X25519 and P-256 key exchange.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads `path` (bounded).
fn read_pem(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    read_capped(path, PEM_FILE_BYTES_MAX).map_err(|source| TlsFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in the PEM file at `path`; at least one.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read_pem(path)?;
    let kind = PemKind::Certificate;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsFileError::Pem {
            path: path.to_path_buf(),
            kind,
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsFileError::Empty {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok(certs)
}

/// The private key in the PEM file at `path`.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| TlsFileError::NoKey {
        path: path.to_path_buf(),
        source,
    })
}

/// The CA certificates of the PEM file at `path`, as trust anchors.
fn load_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsFileError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|source| TlsFileError::BadCa {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(Arc::new(roots))
}

/// The revocation lists in the PEM file at `path`; at least one.
fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsFileError> {
    let pem = read_pem(path)?;
    let kind = PemKind::RevocationList;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsFileError::Pem {
            path: path.to_path_buf(),
            kind,
            source,
        })?;
    if crls.is_empty() {
        return Err(TlsFileError::Empty {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok(crls)
}

/// A short fingerprint of a certificate (BLAKE3 of its DER, 8 bytes in
/// hex), for log lines that say which certificate is served.
pub(crate) fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let h = blake3::hash(cert.as_ref());
    h.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The files a node's client TLS is made of (`[client]` in its config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The node's certificate chain, leaf first (`client.tls_cert_file`).
    pub cert: PathBuf,
    /// Its private key (`client.tls_key_file`).
    pub key: PathBuf,
    /// If set, every client must present a certificate chaining to a CA
    /// in this file (mTLS; `client.tls_client_ca_file`).
    pub client_ca: Option<PathBuf>,
    /// Revocation lists (PEM) of the client CA: a client certificate they
    /// name is refused (`client.tls_client_crl_file`; needs `client_ca`).
    pub client_crl: Option<PathBuf>,
    /// The oldest version accepted (`client.tls_min_version`).
    pub min_version: TlsVersion,
    /// With `client_ca`: a peer may also come without a certificate (one
    /// it shows must still verify). The admin endpoint's, whose readers
    /// (scrapers, `curl`) need none and whose admins may show one.
    pub client_cert_optional: bool,
}

/// Which of a node's TLS files an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFileRole {
    /// The certificate chain.
    Cert,
    /// The private key (or the key does not match the certificate).
    Key,
    /// The client CA.
    ClientCa,
    /// The client CA's revocation lists.
    ClientCrl,
}

impl ServerTlsFiles {
    /// The same files, for the admin endpoint: client certificates asked
    /// for (if a client CA is set) but not required.
    pub fn for_admin(&self) -> ServerTlsFiles {
        ServerTlsFiles {
            client_cert_optional: true,
            ..self.clone()
        }
    }

    /// Reads the files and builds the config, with a line saying what it
    /// serves; an error says which file is at fault, and why.
    pub fn load(&self) -> Result<(Arc<rustls::ServerConfig>, String), (TlsFileRole, TlsFileError)> {
        let certs = load_certs(&self.cert).map_err(|e| (TlsFileRole::Cert, e))?;
        let key = load_key(&self.key).map_err(|e| (TlsFileRole::Key, e))?;
        let leaf = fingerprint(&certs[0]);
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(self.min_version.versions())
            .expect("the ring provider supports TLS 1.2 and 1.3");
        let builder = match &self.client_ca {
            Some(ca) => {
                let ca_err = |e: TlsFileError| (TlsFileRole::ClientCa, e);
                let roots = load_roots(ca).map_err(ca_err)?;
                let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider());
                if let Some(crl) = &self.client_crl {
                    let crls = load_crls(crl).map_err(|e| (TlsFileRole::ClientCrl, e))?;
                    // A list revokes what its CA issued; the client CA is
                    // a root, so only the client's own certificate is
                    // checked, and one of a CA without a list passes.
                    verifier = verifier
                        .with_crls(crls)
                        .only_check_end_entity_revocation()
                        .allow_unknown_revocation_status();
                }
                if self.client_cert_optional {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier.build().map_err(|source| {
                    ca_err(TlsFileError::Verifier {
                        path: ca.clone(),
                        source,
                    })
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(certs, key).map_err(|source| {
            let why = TlsFileError::KeyMismatch {
                key: self.key.clone(),
                cert: self.cert.clone(),
                source: Box::new(source),
            };
            (TlsFileRole::Key, why)
        })?;
        let mtls = match (&self.client_ca, &self.client_crl) {
            (Some(ca), _) if self.client_cert_optional => format!(
                "client certificates optional, checked against {} if shown",
                ca.display()
            ),
            (Some(ca), None) => format!("client certificates checked against {}", ca.display()),
            (Some(ca), Some(crl)) => format!(
                "client certificates checked against {} and the revocations in {}",
                ca.display(),
                crl.display()
            ),
            (None, _) => "no client certificates asked".into(),
        };
        let what = format!(
            "TLS {}+ with {} (blake3 {leaf}); {mtls}",
            self.min_version,
            self.cert.display()
        );
        Ok((Arc::new(config), what))
    }
}

/// A node's client TLS: the config every new connection takes, replaced
/// whole by [`reload`](Self::reload) (connections keep the one they
/// started with). Read once per accepted connection, never per request.
pub struct ServerTls {
    files: ServerTlsFiles,
    current: Mutex<(Arc<rustls::ServerConfig>, String)>,
}

impl ServerTls {
    /// Loads `files`; errors name the file at fault.
    pub fn load(files: ServerTlsFiles) -> Result<ServerTls, TlsFileError> {
        let current = files.load().map_err(|e| e.1)?;
        Ok(ServerTls {
            files,
            current: Mutex::new(current),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<rustls::ServerConfig>, String)> {
        // Every change is one assignment: a panic elsewhere left it whole.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The config new connections take now.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.lock().0)
    }

    /// What is served, for the log: version, certificate file and its
    /// fingerprint, whether client certificates are asked.
    pub fn describe(&self) -> String {
        self.lock().1.clone()
    }

    /// Reads the files again: on success new connections get the new
    /// certificate (and CA); on an error the config in use stays.
    pub fn reload(&self) -> Result<String, TlsFileError> {
        let next = self.files.load().map_err(|e| e.1)?;
        let what = next.1.clone();
        *self.lock() = next;
        Ok(what)
    }

    /// A server connection with the current config.
    pub fn accept(&self) -> Result<rustls::ServerConnection, rustls::Error> {
        rustls::ServerConnection::new(self.config())
    }
}

/// What a client's TLS is made of (`--ca`, `--cert`, `--key`,
/// `--tls-name`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA certificates a node's certificate must chain to.
    pub ca: PathBuf,
    /// The client's certificate chain, for nodes that ask for one (mTLS).
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The name the node's certificate must carry; by default the IP
    /// address the client connects to.
    pub server_name: Option<String>,
}

/// A client's TLS config: what a client connection is opened with.
#[derive(Debug)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl ClientTls {
    /// Loads `files`; errors name the file at fault.
    pub fn load(files: &ClientTlsFiles) -> Result<Arc<ClientTls>, TlsFileError> {
        let roots = load_roots(&files.ca)?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(TlsVersion::V1_2.versions())
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .with_root_certificates(roots);
        let config = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
                .map_err(|source| TlsFileError::ClientAuth {
                    cert: cert.clone(),
                    key: key.clone(),
                    source: Box::new(source),
                })?,
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => return Err(TlsFileError::CertWithoutKey),
            (None, Some(_)) => return Err(TlsFileError::KeyWithoutCert),
        };
        let server_name = match &files.server_name {
            Some(n) => Some(ServerName::try_from(n.clone()).map_err(|source| {
                TlsFileError::ServerName {
                    name: n.clone(),
                    source,
                }
            })?),
            None => None,
        };
        Ok(Arc::new(ClientTls {
            config: Arc::new(config),
            server_name,
        }))
    }

    /// A client connection to the node at `addr`, which must show a
    /// certificate for the configured name, or else for `addr`'s IP.
    pub fn connect(&self, addr: SocketAddr) -> Result<rustls::ClientConnection, rustls::Error> {
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        rustls::ClientConnection::new(Arc::clone(&self.config), name)
    }
}
