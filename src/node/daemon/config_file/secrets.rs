//! The checks of what a node must keep secret or prove: the cluster key,
//! the client and admin tokens, the principals' credentials, and the TLS
//! files of the client listener and the admin endpoint. Each returns the
//! first fault, naming its key; a secret file readable by others is a
//! warning. None writes a file or logs a secret's bytes.

use super::raw::{RawClient, RawNode};
use super::{bad, resolve, Bad, CLUSTER_KEY_BYTES_MIN};
use crate::node::client::credentials::ADMIN_TOKEN_BYTES_MIN;
use crate::node::client::credentials::{
    Credentials, Principal, RawCredentials, GRANTS_PER_PRINCIPAL_MAX,
};
use crate::tls::{ServerTlsFiles, TlsFileRole, TlsVersion};
use crate::transport::ClusterKey;
use std::path::{Path, PathBuf};

/// `[client]`'s TLS keys: the files a node serves TLS with, or `None`
/// if the config says `plain = true` (plain TCP is never a default). The
/// files are loaded here, so a bad certificate or a key that does not
/// match it stops the daemon before it binds anything.
pub(super) fn client_tls(raw: &RawClient, dir: &Path) -> Result<Option<ServerTlsFiles>, Bad> {
    let tls_keys = [
        ("tls_cert_file", raw.tls_cert_file.is_some()),
        ("tls_key_file", raw.tls_key_file.is_some()),
        ("tls_client_ca_file", raw.tls_client_ca_file.is_some()),
        ("tls_client_crl_file", raw.tls_client_crl_file.is_some()),
        ("tls_min_version", raw.tls_min_version.is_some()),
    ];
    if raw.plain == Some(true) {
        if let Some((key, _)) = tls_keys.iter().find(|k| k.1) {
            return Err(bad(
                "client.plain",
                format!("is true, but client.{key} is set too: keep one (clients are served either plain or over TLS)"),
            ));
        }
        return Ok(None);
    }
    let missing = |key: &str| {
        bad(
            format!("client.{key}"),
            "missing: clients are served over TLS (certificate and key files), unless the config says client.plain = true",
        )
    };
    let cert = raw
        .tls_cert_file
        .as_ref()
        .ok_or_else(|| missing("tls_cert_file"))?;
    let key = raw
        .tls_key_file
        .as_ref()
        .ok_or_else(|| missing("tls_key_file"))?;
    let min_version = match raw.tls_min_version.as_deref() {
        None => TlsVersion::default(),
        Some(v) => TlsVersion::parse(v).ok_or_else(|| {
            bad(
                "client.tls_min_version",
                format!("{v:?}: must be \"1.2\" or \"1.3\""),
            )
        })?,
    };
    if raw.tls_client_crl_file.is_some() && raw.tls_client_ca_file.is_none() {
        return Err(bad(
            "client.tls_client_crl_file",
            "revokes client certificates, which only client.tls_client_ca_file asks for: set it too",
        ));
    }
    let files = ServerTlsFiles {
        cert: resolve(dir, cert),
        key: resolve(dir, key),
        client_ca: raw.tls_client_ca_file.as_ref().map(|p| resolve(dir, p)),
        client_crl: raw.tls_client_crl_file.as_ref().map(|p| resolve(dir, p)),
        min_version,
        client_cert_optional: false,
    };
    files.load().map_err(|(role, why)| {
        let key = match role {
            TlsFileRole::Cert => "client.tls_cert_file",
            TlsFileRole::Key => "client.tls_key_file",
            TlsFileRole::ClientCa => "client.tls_client_ca_file",
            TlsFileRole::ClientCrl => "client.tls_client_crl_file",
        };
        bad(key, why.to_string())
    })?;
    Ok(Some(files))
}

/// `node.admin_tls`: the files the admin endpoint serves HTTPS with (the
/// client listener's, client certificates optional), or `None` for plain
/// HTTP (the default).
pub(super) fn admin_tls(
    raw: &RawNode,
    client_tls: Option<&ServerTlsFiles>,
) -> Result<Option<ServerTlsFiles>, Bad> {
    match (raw.admin_tls.unwrap_or(false), client_tls) {
        (false, _) => Ok(None),
        (true, Some(files)) => Ok(Some(files.for_admin())),
        (true, None) => Err(bad(
            "node.admin_tls",
            "serves the admin endpoint with the client listener's certificate, and this config serves clients plain (client.plain = true): set client.tls_cert_file and client.tls_key_file instead of client.plain, or drop node.admin_tls",
        )),
    }
}

/// `node.cluster_key_file`: enough secret to derive the key from.
pub(super) fn cluster_key(
    raw: &RawNode,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<ClusterKey, Bad> {
    let key_file = resolve(dir, &raw.cluster_key_file);
    let secret = read_secret("node.cluster_key_file", &key_file, warnings)?;
    if secret.len() < CLUSTER_KEY_BYTES_MIN {
        return Err(bad(
            "node.cluster_key_file",
            format!(
                "{} holds {} bytes; at least {CLUSTER_KEY_BYTES_MIN} are needed (head -c 32 /dev/urandom | base64 > FILE)",
                key_file.display(),
                secret.len()
            ),
        ));
    }
    Ok(ClusterKey::derive(&secret))
}

/// `node.admin_token_file`, if given: long enough to resist guessing,
/// and not the client token (a client must not be able to change the
/// membership). Returns the resolved path.
pub(super) fn admin_token(
    raw: &RawNode,
    dir: &Path,
    client_token: &[u8],
    warnings: &mut Vec<String>,
) -> Result<Option<PathBuf>, Bad> {
    const KEY: &str = "node.admin_token_file";
    let Some(file) = &raw.admin_token_file else {
        return Ok(None);
    };
    let file = resolve(dir, file);
    let token = read_secret(KEY, &file, warnings)?;
    if token.len() < ADMIN_TOKEN_BYTES_MIN {
        return Err(bad(
            KEY,
            format!(
                "{} holds {} bytes; at least {ADMIN_TOKEN_BYTES_MIN} are needed (head -c 32 /dev/urandom | base64 > FILE)",
                file.display(),
                token.len()
            ),
        ));
    }
    if token == client_token {
        return Err(bad(
            KEY,
            format!(
                "{} holds the client token (node.auth_token_file); the admin token must be a secret of its own",
                file.display()
            ),
        ));
    }
    Ok(Some(file))
}

/// Bytes a principal's name may have at most (it is a metric label).
const PRINCIPAL_NAME_BYTES_MAX: usize = 64;

/// `node.credentials_file`: the principals besides the cluster token's
/// (which has every permission). Their tokens are read here, checked
/// unique; a certificate principal needs mTLS on (`mtls`).
pub(super) fn credentials(
    raw: &RawNode,
    dir: &Path,
    client_token: &[u8],
    mtls: bool,
    warnings: &mut Vec<String>,
) -> Result<Credentials, Bad> {
    const KEY: &str = "node.credentials_file";
    let mut creds = Credentials::cluster_only(client_token);
    let Some(file) = &raw.credentials_file else {
        return Ok(creds);
    };
    let file = resolve(dir, file);
    let text = crate::io::private::read_capped(&file, crate::io::private::CONFIG_FILE_BYTES_MAX)
        .map_err(|e| bad(KEY, format!("{}: cannot read it: {e}", file.display())))?;
    let text = String::from_utf8(text)
        .map_err(|_| bad(KEY, format!("{}: not UTF-8 text", file.display())))?;
    let de = toml::Deserializer::parse(&text).map_err(|e| {
        bad(
            KEY,
            format!("{}: not TOML: {}", file.display(), e.message()),
        )
    })?;
    let parsed: RawCredentials = serde_path_to_error::deserialize(de).map_err(|e| {
        bad(
            KEY,
            format!("{}: {}: {}", file.display(), e.path(), e.inner().message()),
        )
    })?;
    let cred_dir = file.parent().unwrap_or(dir);
    for (i, p) in parsed.principals.into_iter().enumerate() {
        let at = |what: String| bad(KEY, format!("{}: principals[{i}]: {what}", file.display()));
        let name_ok = !p.name.is_empty()
            && p.name.len() <= PRINCIPAL_NAME_BYTES_MAX
            && p.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(at(format!(
                "name {:?}: 1 to {PRINCIPAL_NAME_BYTES_MAX} of A-Z a-z 0-9 . _ -",
                p.name
            )));
        }
        if p.token_file.is_none() && p.cert_common_name.is_none() {
            return Err(at(format!(
                "{:?} has neither token_file nor cert_common_name: nothing could be it",
                p.name
            )));
        }
        if p.cert_common_name.is_some() && !mtls {
            return Err(at(format!(
                "{:?} is known by a client certificate, which only client.tls_client_ca_file asks for",
                p.name
            )));
        }
        if p.grants.len() > GRANTS_PER_PRINCIPAL_MAX {
            return Err(at(format!("more than {GRANTS_PER_PRINCIPAL_MAX} grants")));
        }
        if let Some(g) = p.grants.iter().position(|g| g.allow.is_empty()) {
            return Err(at(format!("grants[{g}] allows nothing")));
        }
        let queue_admin = p.grants.iter().position(|g| {
            g.queues.is_some()
                && g.allow
                    .contains(&crate::node::client::credentials::Permission::Admin)
        });
        if let Some(g) = queue_admin {
            return Err(at(format!(
                "grants[{g}] allows \"admin\" on queues: admin is membership of whole groups; give it in a grant without `queues`"
            )));
        }
        let token = match &p.token_file {
            Some(t) => Some(read_secret(KEY, &resolve(cred_dir, t), warnings)?),
            None => None,
        };
        for (key, rate) in [
            ("quota_bytes_per_s", p.quota_bytes_per_s),
            ("quota_requests_per_s", p.quota_requests_per_s),
        ] {
            if rate == Some(0) {
                return Err(at(format!(
                    "{key} = 0 would stop every write; leave it out for no quota, or take \"append\" from its grants"
                )));
            }
        }
        let principal = Principal {
            name: p.name,
            all: false,
            grants: p.grants,
            quota: crate::node::client::quota::Quota {
                bytes_per_s: p.quota_bytes_per_s,
                requests_per_s: p.quota_requests_per_s,
            },
        };
        creds
            .add(principal, token.as_deref(), p.cert_common_name.as_deref())
            .map_err(at)?;
    }
    Ok(creds)
}

/// Reads a secret file: it must exist and hold something.
pub(super) fn read_secret(
    key: &str,
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<u8>, Bad> {
    let bytes = crate::io::private::read_capped(path, crate::io::private::SECRET_FILE_BYTES_MAX)
        .map_err(|e| bad(key, format!("{}: cannot read it: {e}", path.display())))?;
    let len = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    if len == 0 {
        return Err(bad(key, format!("{} is empty", path.display())));
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            warnings.push(format!(
                "{key}: {} is readable by other users (chmod 600 it)",
                path.display()
            ));
        }
    }
    Ok(bytes[..len].to_vec())
}
