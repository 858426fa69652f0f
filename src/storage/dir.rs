//! The storage seam: every file-system call the WAL makes besides the
//! flush path, behind [`LogDir`] and [`LogFile`], so the same format,
//! recovery scan, segment and snapshot code runs on a real directory
//! ([`OsDir`]) and on the simulator's block devices (`sim::device`).
//!
//! Names are file names inside the log's directory, never paths. Errors
//! are `io::Error`s with raw OS codes (`ENOSPC`, `EIO`), so the WAL tells
//! cases apart the same way over both. The flush path (a batch's write and
//! fdatasync) goes through the directory's [`crate::io::IoBackend`], which
//! the directory hands out: io_uring or pwrite for `OsDir`, the simulated
//! device's queue for the simulator.

use crate::io::{open_backend, BackendChoice, IoBackend};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One log directory on one device.
pub trait LogDir: Clone + Send + 'static {
    /// An open file of this directory.
    type File: LogFile;
    /// Where the log is, for messages ("/srv/quire/g0", "sim n2/g1").
    fn describe(&self) -> String;
    /// Creates the directory if it is missing (owner-only).
    fn create(&self) -> io::Result<()>;
    /// Opens `name` and takes an exclusive lock on it; `WouldBlock` if
    /// another opener holds it.
    fn lock(&self, name: &str) -> io::Result<Self::File>;
    /// True if `name` exists.
    fn exists(&self, name: &str) -> bool;
    /// The names in the directory, sorted.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens `name` read-write, creating it; with O_DIRECT if `direct`
    /// and the filesystem accepts it. Returns whether it is on, and why.
    fn open(&self, name: &str, direct: bool) -> io::Result<(Self::File, bool, String)>;
    /// Creates `name` empty (truncating what was there), for writing.
    fn create_new(&self, name: &str) -> io::Result<Self::File>;
    /// `create_new` with O_DIRECT where the filesystem accepts it (true if
    /// on): a zero-fill then costs no page-cache copy. By default buffered.
    fn create_new_direct(&self, name: &str) -> io::Result<(Self::File, bool)> {
        Ok((self.create_new(name)?, false))
    }
    /// Reads all of `name`.
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;
    /// Opens `name`, which must exist, for reading (a reader on another
    /// thread: it must never create what it looks for).
    fn open_existing(&self, name: &str) -> io::Result<Self::File>;
    /// Renames `from` to `to`, replacing `to`; durable at the next `sync`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name`; durable at the next `sync`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the directory's names durable (fsync of the directory).
    fn sync(&self) -> io::Result<()>;
    /// The flush path's backend for this directory's files, and why it
    /// was chosen.
    fn backend(
        &self,
        choice: BackendChoice,
        depth: u32,
    ) -> io::Result<(Box<dyn IoBackend>, String)>;
    /// Microseconds on a monotonic clock (flush latencies, stalls,
    /// retries): the simulator's virtual time under the seed.
    fn now_us(&self) -> u64;
    /// True if the log's slow jobs (zero-fills, directory syncs, unlinks)
    /// must run when submitted, on the caller's thread, instead of on a
    /// background thread: the simulator's, so a run replays from its seed.
    fn jobs_inline(&self) -> bool {
        false
    }
}

/// An open file of a [`LogDir`].
pub trait LogFile: Send {
    /// The descriptor the flush path's requests name.
    fn fd(&self) -> RawFd;
    /// Its length in bytes.
    fn size_bytes(&self) -> io::Result<u64>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (not durable until a sync).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Starts and waits for writeback of a range, without making it
    /// durable (so the final sync has less to do).
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes the file's data durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable (fsync).
    fn sync_all(&self) -> io::Result<()>;
}

/// A log directory on the host's filesystem.
#[derive(Clone, Debug)]
pub struct OsDir {
    root: PathBuf,
    epoch: Instant,
}

impl OsDir {
    /// The directory at `root` (not created until [`LogDir::create`]).
    pub fn new(root: &Path) -> OsDir {
        OsDir {
            root: root.to_path_buf(),
            epoch: Instant::now(),
        }
    }

    /// The directory's path.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl LogDir for OsDir {
    type File = File;

    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn create(&self) -> io::Result<()> {
        crate::io::private::create_dir_all(&self.root)
    }

    fn lock(&self, name: &str) -> io::Result<File> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::io::private::FILE_MODE)
            .open(self.root.join(name))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    fn exists(&self, name: &str) -> bool {
        self.root.join(name).exists()
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.root)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort_unstable();
        Ok(names)
    }

    fn open(&self, name: &str, direct: bool) -> io::Result<(File, bool, String)> {
        open_data_file(&self.root.join(name), direct)
    }

    fn create_new(&self, name: &str) -> io::Result<File> {
        truncating_writer().open(self.root.join(name))
    }

    fn create_new_direct(&self, name: &str) -> io::Result<(File, bool)> {
        let created = truncating_writer()
            .custom_flags(libc::O_DIRECT)
            .open(self.root.join(name));
        match created {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((self.create_new(name)?, false)),
            Err(e) => Err(e),
        }
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.root.join(name))
    }

    fn open_existing(&self, name: &str) -> io::Result<File> {
        File::open(self.root.join(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.root.join(from), self.root.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.root.join(name))
    }

    fn sync(&self) -> io::Result<()> {
        File::open(&self.root)?.sync_all()
    }

    fn backend(
        &self,
        choice: BackendChoice,
        depth: u32,
    ) -> io::Result<(Box<dyn IoBackend>, String)> {
        open_backend(choice, depth)
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

impl LogFile for File {
    fn fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }

    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe {
            libc::sync_file_range(
                self.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                flags,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

/// Opens `path` read-write (creating it, owner-only), with O_DIRECT if
/// wanted and the filesystem accepts it. Returns whether it is on, and why.
/// Options that create a file (owner-only) or truncate what was there,
/// for writing.
fn truncating_writer() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.create(true)
        .truncate(true)
        .write(true)
        .mode(crate::io::private::FILE_MODE);
    o
}

fn open_data_file(path: &Path, want_direct: bool) -> io::Result<(File, bool, String)> {
    let base = || {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(true).truncate(false);
        o.mode(crate::io::private::FILE_MODE);
        o
    };
    if want_direct {
        match base().custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => return Ok((f, true, "O_DIRECT writes".into())),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let why = "buffered writes + fdatasync (the filesystem refuses O_DIRECT)";
                return Ok((base().open(path)?, false, why.into()));
            }
            Err(e) => return Err(e),
        }
    }
    let why = "buffered writes + fdatasync (O_DIRECT off by configuration)";
    Ok((base().open(path)?, false, why.into()))
}
