//! What a node takes from its process besides its logs and sockets:
//! randomness from the OS, for what must differ at every start.

/// A seed from the OS for what must differ at every start (session
/// epochs, election jitter); falls back to the clock and the pid.
pub(crate) fn os_seed() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (std::process::id() as u64).rotate_left(32)
        }
    }
}
