//! Certificates made here, with rcgen: a local CA and the node and
//! client certificates it signs, for `quire up`'s demo cluster and the
//! tests. A production cluster's certificates come from the operator's
//! own CA (tuning/README.md, "Certificates and credentials"); these are
//! the same kind (ECDSA P-256, SHA-256), signed by a CA that lives in the
//! cluster directory.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SerialNumber,
};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// What [`LocalCa`] was making when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Making {
    /// The CA's key.
    CaKey,
    /// The CA's certificate.
    CaCertificate,
    /// A certificate for this common name.
    Certificate(String),
    /// A certificate revocation list.
    RevocationList,
}

impl fmt::Display for Making {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Making::CaKey => f.write_str("a CA key"),
            Making::CaCertificate => f.write_str("the CA certificate"),
            Making::Certificate(cn) => write!(f, "a certificate for {cn}"),
            Making::RevocationList => f.write_str("a revocation list"),
        }
    }
}

/// Why [`LocalCa`] could not make a key, certificate or revocation list.
#[derive(Debug)]
pub enum IssueError {
    /// rcgen refused the parameters, or signing failed.
    Rcgen {
        /// What was being made.
        making: Making,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// The OS's random source could not be read for a serial number.
    Entropy {
        /// What was being made.
        making: Making,
        /// The random source's error.
        source: crate::entropy::EntropyError,
    },
}

impl fmt::Display for IssueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IssueError::Rcgen { making, source } => write!(f, "{making}: {source}"),
            IssueError::Entropy { making, source } => write!(f, "{making}: {source}"),
        }
    }
}

impl std::error::Error for IssueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IssueError::Rcgen { source, .. } => Some(source),
            IssueError::Entropy { source, .. } => Some(source),
        }
    }
}

/// A map_err for an rcgen error while making `making`.
fn rcgen_err(making: Making) -> impl Fn(rcgen::Error) -> IssueError {
    move |source| IssueError::Rcgen {
        making: making.clone(),
        source,
    }
}

/// Days a certificate made by [`LocalCa`] is valid by default, from a
/// day before it was made (a clock a little behind still accepts it).
pub const CERT_VALID_DAYS: i64 = 398;

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate (`-----BEGIN CERTIFICATE-----`).
    pub cert_pem: String,
    /// Its private key (`-----BEGIN PRIVATE KEY-----`): keep it 0600.
    pub key_pem: String,
    /// Its serial number (random), which a revocation list names.
    pub serial: u64,
}

/// What a certificate is for.
#[derive(Clone, Debug)]
pub struct CertRequest {
    /// Its subject's common name (for a client: the name its principal
    /// is known by).
    pub common_name: String,
    /// DNS names and IP addresses it is valid for (a node's).
    pub names: Vec<String>,
    /// A node's (server authentication) or a client's.
    pub server: bool,
    /// Valid from this many days from now (negative: in the past) ...
    pub from_days: i64,
    /// ... until this many (a negative one makes an expired certificate).
    pub until_days: i64,
}

impl CertRequest {
    /// A node's certificate for `names`, valid [`CERT_VALID_DAYS`].
    pub fn server(common_name: &str, names: &[&str]) -> CertRequest {
        CertRequest {
            common_name: common_name.into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            server: true,
            from_days: -1,
            until_days: CERT_VALID_DAYS,
        }
    }

    /// A client's certificate with subject CN `common_name`.
    pub fn client(common_name: &str) -> CertRequest {
        CertRequest {
            common_name: common_name.into(),
            names: Vec::new(),
            server: false,
            from_days: -1,
            until_days: CERT_VALID_DAYS,
        }
    }
}

/// A certificate authority whose key is in memory.
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

/// The date `days` days from now (UTC), for rcgen.
fn date_from_now(days: i64) -> time_shim::Date {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time_shim::civil_from_days(now.div_euclid(86_400) + days)
}

mod time_shim {
    /// A civil date: year, month (1-12), day (1-31).
    pub(super) type Date = (i32, u8, u8);

    /// The civil date of day `z` since 1970-01-01 (Howard Hinnant's
    /// algorithm: proleptic Gregorian, any day).
    pub(super) fn civil_from_days(z: i64) -> Date {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let y = yoe + era * 400 + i64::from(m <= 2);
        (y as i32, m, d)
    }
}

/// Makes `params` valid from `from_days` to `until_days` from now.
fn set_validity(params: &mut CertificateParams, from_days: i64, until_days: i64) {
    let (y, m, d) = date_from_now(from_days);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = date_from_now(until_days);
    params.not_after = rcgen::date_time_ymd(y, m, d);
}

impl LocalCa {
    /// A new CA (fresh key) with subject CN `name`, valid ten years.
    pub fn generate(name: &str) -> Result<LocalCa, IssueError> {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(rcgen_err(Making::CaCertificate))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, -1, 3650);
        let key = KeyPair::generate().map_err(rcgen_err(Making::CaKey))?;
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err(Making::CaCertificate))?;
        let key_pem = key.serialize_pem();
        Ok(LocalCa {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA's certificate, PEM: what clients (`--ca`) and nodes
    /// (`client.tls_client_ca_file`) trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM (to sign more certificates later).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate (fresh key) for `req`, signed by this CA.
    pub fn issue(&self, req: &CertRequest) -> Result<Issued, IssueError> {
        let making = || Making::Certificate(req.common_name.clone());
        let what = rcgen_err(making());
        let mut params = CertificateParams::new(req.names.clone()).map_err(&what)?;
        params
            .distinguished_name
            .push(DnType::CommonName, req.common_name.as_str());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![if req.server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        set_validity(&mut params, req.from_days, req.until_days);
        // Positive and non-zero, as RFC 5280 asks.
        let serial = crate::entropy::random_u64().map_err(|source| IssueError::Entropy {
            making: making(),
            source,
        })?;
        let serial = (serial >> 1).max(1);
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().map_err(&what)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(what)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial,
        })
    }

    /// A certificate revocation list (PEM) of this CA naming `serials`
    /// (`client.tls_client_crl_file`), valid 30 days; `number` must grow
    /// with each list the CA issues.
    pub fn revocation_list(&self, serials: &[u64], number: u64) -> Result<String, IssueError> {
        let at = |days| {
            let (y, m, d) = date_from_now(days);
            rcgen::date_time_ymd(y, m, d)
        };
        let params = CertificateRevocationListParams {
            this_update: at(-1),
            next_update: at(30),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: at(-1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params
            .signed_by(&self.issuer)
            .map_err(rcgen_err(Making::RevocationList))?;
        crl.pem().map_err(rcgen_err(Making::RevocationList))
    }
}

#[cfg(test)]
mod tests {
    use super::time_shim::civil_from_days;

    #[test]
    fn no_certificate_is_issued_without_the_os_random_source() {
        let ca = super::LocalCa::generate("test CA").unwrap();
        let req = super::CertRequest::server("node1", &["127.0.0.1"]);
        crate::entropy::fail_in_this_thread(true);
        let refused = ca.issue(&req).err();
        crate::entropy::fail_in_this_thread(false);
        let why = refused.expect("a serial from the clock was minted");
        assert!(matches!(why, super::IssueError::Entropy { .. }), "{why}");
        let why = why.to_string();
        assert!(why.contains("cannot read the OS's random source"), "{why}");
        assert!(ca.issue(&req).is_ok());
    }

    #[test]
    fn civil_dates_of_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_791), (2026, 12, 4));
    }
}
