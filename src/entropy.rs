//! The operating system's randomness, for everything that must not be
//! guessed: cluster keys and tokens (`quire up`), certificate serial
//! numbers (RFC 5280 asks for unpredictable ones), client ids, and the
//! seeds of a node's timers and transport sessions. Read with getrandom(2)
//! and nothing weaker: when it cannot be read, the caller refuses to mint
//! (a clock or a pid is public, and a key made from one is no key). A
//! leaf: it imports nothing from the crate.

use std::fmt;
use std::io;

/// The OS's random source could not be read.
#[derive(Debug)]
pub struct EntropyError(io::Error);

impl fmt::Display for EntropyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read the OS's random source (getrandom): {}; refusing to mint keys, tokens, serial numbers or seeds from anything weaker",
            self.0
        )
    }
}

impl std::error::Error for EntropyError {}

impl From<EntropyError> for io::Error {
    fn from(e: EntropyError) -> io::Error {
        io::Error::new(e.0.kind(), e.to_string())
    }
}

#[cfg(test)]
thread_local! {
    /// Set by a test: this thread's reads of the random source fail.
    static FAIL_IN_THIS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's reads of the random source fail (`on`) or work
/// again, as a kernel without getrandom would: for tests of the refusals.
#[cfg(test)]
pub(crate) fn fail_in_this_thread(on: bool) {
    FAIL_IN_THIS_THREAD.with(|f| f.set(on));
}

/// Fills `b` from the kernel's random source, blocking only until its
/// pool is initialised (early boot).
pub fn fill(b: &mut [u8]) -> Result<(), EntropyError> {
    #[cfg(test)]
    if FAIL_IN_THIS_THREAD.with(std::cell::Cell::get) {
        return Err(EntropyError(io::Error::from_raw_os_error(libc::ENOSYS)));
    }
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(EntropyError(e));
        }
        filled += n as usize;
    }
    Ok(())
}

/// 64 random bits.
pub fn random_u64() -> Result<u64, EntropyError> {
    let mut b = [0u8; 8];
    fill(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// `bytes` random bytes as lowercase hex (a key or token file's text).
pub fn random_hex(bytes: usize) -> Result<String, EntropyError> {
    let mut b = vec![0u8; bytes];
    fill(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_has_the_length_asked_and_differs_each_time() {
        let a = random_hex(24).unwrap();
        assert_eq!(a.len(), 48);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_hex(24).unwrap());
    }

    #[test]
    fn a_failing_source_is_an_error_that_says_so() {
        fail_in_this_thread(true);
        let e = random_u64().unwrap_err().to_string();
        fail_in_this_thread(false);
        assert!(e.contains("cannot read the OS's random source"), "{e}");
        assert!(random_u64().is_ok());
    }
}
