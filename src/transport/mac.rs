//! The cluster key and the datagram MAC: keyed BLAKE3 over header and
//! frames, truncated to 16 bytes, compared in constant time.
//!
//! This file owns the only use of the key. It must never log or format the
//! key, and never compare tags with `==` (a timing leak lets an attacker
//! forge a tag byte by byte).

/// Bytes of the MAC that ends every datagram.
pub const MAC_BYTES: usize = 16;

/// Context string for [`ClusterKey::derive`]; changing it changes every key.
const DERIVE_CONTEXT: &str = "quire 2025 transport cluster key v1";

/// The secret shared by every node of a cluster; authenticates datagrams.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// A key from 32 secret bytes (for example read from a key file).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterKey(bytes)
    }

    /// A key derived from secret material of any length (a passphrase or a
    /// longer key file) with BLAKE3's key derivation mode.
    pub fn derive(secret: &[u8]) -> Self {
        ClusterKey(blake3::derive_key(DERIVE_CONTEXT, secret))
    }

    /// The MAC of `data`.
    pub(crate) fn tag(&self, data: &[u8]) -> [u8; MAC_BYTES] {
        let full = blake3::keyed_hash(&self.0, data);
        let mut tag = [0u8; MAC_BYTES];
        tag.copy_from_slice(&full.as_bytes()[..MAC_BYTES]);
        tag
    }

    /// True if `tag` is the MAC of `data`, compared in constant time.
    pub(crate) fn verify(&self, data: &[u8], tag: &[u8; MAC_BYTES]) -> bool {
        constant_time_eq::constant_time_eq_16(&self.tag(data), tag)
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, not even in a panic message.
        f.write_str("ClusterKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_depends_on_key_and_data() {
        let a = ClusterKey::derive(b"secret a");
        let b = ClusterKey::derive(b"secret b");
        let t = a.tag(b"hello");
        assert!(a.verify(b"hello", &t));
        assert!(!b.verify(b"hello", &t));
        assert!(!a.verify(b"hellp", &t));
        let mut forged = t;
        forged[15] ^= 1;
        assert!(!a.verify(b"hello", &forged));
    }

    #[test]
    fn debug_hides_the_key() {
        let k = ClusterKey::from_bytes([0xab; 32]);
        assert_eq!(format!("{k:?}"), "ClusterKey(..)");
    }
}
