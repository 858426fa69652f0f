//! The modes of what quire creates: files 0600 and directories 0700,
//! owner only. Logs hold client data, key and token files hold secrets,
//! and a config names where they are: nothing quire writes is for other
//! users of the host. The umask can only narrow these further. Existing
//! files and directories keep the mode they have (an operator's choice).
//! Also the bounded read of the small files quire is given (configs,
//! keys, tokens): a path naming `/dev/zero` or a huge file is refused,
//! not read until memory runs out.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Mode of every file quire creates: read-write for its owner only.
pub const FILE_MODE: u32 = 0o600;

/// Mode of every directory quire creates: its owner only.
pub const DIR_MODE: u32 = 0o700;

/// `std::fs::create_dir_all`, each directory it creates [`DIR_MODE`].
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// `std::fs::write`, the file created [`FILE_MODE`] if it is new.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?
        .write_all(contents.as_ref())
}

/// Bytes of a config file at most.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;
/// Bytes of a key or token file at most.
pub const SECRET_FILE_BYTES_MAX: u64 = 64 << 10;

/// `std::fs::read`, refusing a file (or device) longer than `limit_bytes`
/// with an `InvalidData` error that says so.
pub fn read_capped(path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(limit_bytes + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {limit_bytes} bytes, more than such a file holds"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn what_it_creates_is_the_owners_only() {
        let d = tempfile::tempdir().unwrap();
        let deep = d.path().join("a").join("b");
        create_dir_all(&deep).unwrap();
        write(&deep.join("f"), b"secret").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d.path().join("a")), 0o700);
        assert_eq!(mode(&deep), 0o700);
        assert_eq!(mode(&deep.join("f")), 0o600);
        assert_eq!(std::fs::read(deep.join("f")).unwrap(), b"secret");
    }

    #[test]
    fn a_capped_read_refuses_what_is_longer_and_never_reads_on() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        write(&f, [7u8; 100]).unwrap();
        assert_eq!(read_capped(&f, 100).unwrap(), [7u8; 100]);
        let e = read_capped(&f, 99).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 99 bytes"), "{e}");
        // A device without end is refused at the bound, not read forever.
        let e = read_capped(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
