//! Client identities. The dedup table tells retries apart by (client id,
//! seq), so two clients must never share an id: ids are 64 bits from the
//! kernel's random source, never derived from the pid or the clock (pids
//! are reused; two processes started in the same tick share the clock).
//! 64 random bits make a collision among the `dedup::CLIENTS_MAX` clients a
//! cluster remembers about one chance in 2^33; and should one happen, the
//! dedup table's fingerprint refuses the second client's different bytes
//! with `Conflict` rather than answering with the first one's index.

use std::io;

/// 64 bits from the kernel's random source (getrandom(2)); an error, not
/// a weaker fallback, if it cannot be read (`crate::entropy`).
pub fn os_random_u64() -> io::Result<u64> {
    Ok(crate::entropy::random_u64()?)
}

/// A fresh client id: random, never 0 (0 marks a request that is not
/// deduplicated).
pub fn random_client_id() -> io::Result<u64> {
    loop {
        let id = os_random_u64()?;
        if id != 0 {
            return Ok(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_never_zero() {
        let ids: std::collections::BTreeSet<u64> =
            (0..1000).map(|_| random_client_id().unwrap()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&0));
    }
}
