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
/// a weaker fallback, if it cannot be read.
pub fn os_random_u64() -> io::Result<u64> {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe {
            libc::getrandom(
                b[filled..].as_mut_ptr().cast(),
                b.len() - filled,
                0, // block until the pool is initialised (only at early boot)
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("getrandom: {e}")));
        }
        filled += n as usize;
    }
    Ok(u64::from_le_bytes(b))
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
