//! How a client command reaches the cluster: the TLS config `--ca`,
//! `--cert`, `--key` and `--tls-name` name, and the `Client` a `Target`
//! builds.

use super::cli::{Target, TlsArgs};
use quire::client::Client;

impl TlsArgs {
    /// The client TLS config these flags name, or `None` for plain TCP.
    pub(crate) fn load(&self) -> Result<Option<std::sync::Arc<quire::tls::ClientTls>>, String> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.tls_name.is_some() {
                return Err("--cert, --key and --tls-name need --ca (the CA the nodes' certificates chain to)".into());
            }
            return Ok(None);
        };
        let files = quire::tls::ClientTlsFiles {
            ca: ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            server_name: self.tls_name.clone(),
        };
        quire::tls::ClientTls::load(&files)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// A client of the nodes `t` names, with its token and TLS config.
pub(crate) fn client(t: &Target) -> Result<Client, String> {
    let token = match &t.token_file {
        Some(f) => quire::io::private::read_capped(f, quire::io::private::SECRET_FILE_BYTES_MAX)
            .map_err(|e| format!("{}: {e}", f.display()))?,
        None => Vec::new(),
    };
    let id = quire::client::random_client_id().map_err(|e| format!("a client id: {e}"))?;
    let c = Client::new(t.addr.clone(), token.trim_ascii_end(), id);
    Ok(match t.tls.load()? {
        Some(tls) => c.with_tls(tls),
        None => c,
    })
}
