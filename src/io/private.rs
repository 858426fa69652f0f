//! The modes of what quire creates: files 0600 and directories 0700,
//! owner only. Logs hold client data, key and token files hold secrets,
//! and a config names where they are: nothing quire writes is for other
//! users of the host. The umask can only narrow these further. Existing
//! files and directories keep the mode they have (an operator's choice).

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
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
}
