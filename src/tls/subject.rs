//! The subject common name (CN) of an X.509 certificate, read from its
//! DER with a small bounded walker: what maps a client certificate to a
//! principal (`node::credentials`). rustls has already verified the
//! certificate when this runs, but the walker trusts no length anyway:
//! a malformed certificate yields `None`, never a panic (fuzzed:
//! fuzz/fuzz_targets/cert_subject.rs).

/// Tag of a DER SEQUENCE.
const SEQUENCE: u8 = 0x30;
/// Tag of a DER SET.
const SET: u8 = 0x31;
/// Tag of an OBJECT IDENTIFIER.
const OID: u8 = 0x06;
/// The explicit `[0]` version field of a v3 certificate.
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// One TLV of `der`: its tag, contents and what follows it.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |v, &b| (v << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The contents of the TLV at the front of `der` if its tag is `tag`,
/// and what follows.
fn expect(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, contents, rest) = tlv(der)?;
    (t == tag).then_some((contents, rest))
}

/// The first common name of the certificate `der`'s subject, if it has
/// one in a string type read as text (UTF8String, PrintableString,
/// IA5String, TeletexString taken as Latin-1-free ASCII).
pub fn common_name(der: &[u8]) -> Option<String> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (mut tbs, _) = expect(cert, SEQUENCE)?;
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serial, signature algorithm, issuer, validity, then the subject.
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (mut subject, _) = expect(tbs, SEQUENCE)?;
    while !subject.is_empty() {
        let (mut rdn, rest) = expect(subject, SET)?;
        subject = rest;
        while !rdn.is_empty() {
            let (attr, rest) = expect(rdn, SEQUENCE)?;
            rdn = rest;
            let (oid, value) = expect(attr, OID)?;
            if oid != COMMON_NAME {
                continue;
            }
            let (tag, text, _) = tlv(value)?;
            return match tag {
                0x0c | 0x13 | 0x16 | 0x14 => std::str::from_utf8(text).ok().map(str::to_string),
                _ => None,
            };
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::common_name;
    use crate::tls::issue::{CertRequest, LocalCa};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    #[test]
    fn the_common_name_of_issued_certificates() {
        let ca = LocalCa::generate("test CA").unwrap();
        for name in ["alice", "ops team ü", "node1"] {
            let issued = ca.issue(&CertRequest::client(name)).unwrap();
            let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
            assert_eq!(common_name(&der).as_deref(), Some(name));
        }
    }

    #[test]
    fn malformed_certificates_yield_nothing() {
        let ca = LocalCa::generate("test CA").unwrap();
        let issued = ca.issue(&CertRequest::client("alice")).unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let der = der.as_ref();
        // Every prefix, and every single-byte corruption of the first
        // 200 bytes: no panic, and a cut certificate has no name.
        for n in 0..der.len() {
            assert_eq!(common_name(&der[..n]), None, "prefix of {n}");
        }
        for i in 0..200.min(der.len()) {
            for b in [0x00, 0x7f, 0x80, 0x84, 0xff] {
                let mut d = der.to_vec();
                d[i] = b;
                let _ = common_name(&d);
            }
        }
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
