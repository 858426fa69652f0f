//! A simulated block device holding one log directory, under the real
//! WAL: `storage::Wal::open_in(SimDir)` runs the production format
//! encoder, recovery scan, segment and snapshot code on it, so recovery
//! sees real torn batches (issue 18, item 1).
//!
//! What it models, all from one seed:
//! - writes land in a volatile cache; `sync_data`/`sync_all` (and an
//!   `Fdatasync` op) make a file's cached writes durable;
//! - names (create, rename, remove) are durable at the next directory sync;
//! - a **crash** keeps each unsynced write independently (a subset, not a
//!   prefix: two flushes in flight complete in any order), may tear one
//!   lost write at a 512-byte sector boundary, keeps a random prefix of
//!   the unsynced name changes, and drops every request still queued;
//! - **EIO** on the next sync (the file's cached writes are dropped, as
//!   Linux does after a failed fsync), and a **full disk** (`ENOSPC`);
//! - requests complete out of order, one at a time, when the WAL waits.
//!
//! Time is the device's own virtual clock, advanced by its user. Jobs run
//! inline (`jobs_inline`), so nothing depends on thread scheduling.

use crate::buf::AlignedBuf;
use crate::io::{BackendChoice, IoBackend, IoCompletion, IoOp, IoRequest};
use crate::storage::{LogDir, LogFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// Sector size: the unit a torn write is cut at.
const SECTOR_BYTES: usize = 512;

/// Simulated descriptors start here, so an OS descriptor mixed in fails.
const FD_BASE: RawFd = 1 << 20;

#[derive(Default)]
struct Inode {
    /// What a crash keeps for sure.
    durable: Vec<u8>,
    /// What reads see: durable plus the cached writes.
    data: Vec<u8>,
    /// Writes since the last sync, in order: (offset, bytes).
    cached: Vec<(u64, Vec<u8>)>,
}

impl Inode {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        put(&mut self.data, offset, bytes);
        self.cached.push((offset, bytes.to_vec()));
    }

    /// The cached writes become durable: a copy of what was written
    /// since the last sync, not of the whole file.
    fn sync(&mut self) {
        for (offset, bytes) in self.cached.drain(..) {
            put(&mut self.durable, offset, &bytes);
        }
    }
}

fn put(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let end = offset as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset as usize..end].copy_from_slice(bytes);
}

struct Device {
    rng: ChaCha8Rng,
    now_us: u64,
    inodes: Vec<Inode>,
    names: BTreeMap<String, usize>,
    /// The names as of the last directory sync, and the changes since.
    synced_names: BTreeMap<String, usize>,
    name_changes: Vec<(String, Option<usize>)>,
    /// Open descriptors of the current life: fd → inode.
    fds: BTreeMap<RawFd, usize>,
    next_fd: RawFd,
    /// Bumped by a crash: files and backends of an earlier life are dead.
    life: u64,
    locked: Option<String>,
    /// Requests submitted and not yet run, and those run and not reaped.
    queued: Vec<IoRequest>,
    done: VecDeque<IoCompletion>,
    fail_next_sync: bool,
    capacity_bytes: Option<u64>,
}

impl Device {
    fn used_bytes(&self) -> u64 {
        let live: std::collections::BTreeSet<usize> = self.names.values().copied().collect();
        live.iter().map(|&i| self.inodes[i].data.len() as u64).sum()
    }

    fn inode_of_fd(&self, fd: RawFd) -> io::Result<usize> {
        self.fds
            .get(&fd)
            .copied()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn write(&mut self, inode: usize, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let grows =
            (offset + bytes.len() as u64).saturating_sub(self.inodes[inode].data.len() as u64);
        if let Some(cap) = self.capacity_bytes {
            if grows > 0 && self.used_bytes() + grows > cap {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        self.inodes[inode].write(offset, bytes);
        Ok(())
    }

    fn sync(&mut self, inode: usize) -> io::Result<()> {
        if std::mem::take(&mut self.fail_next_sync) {
            // After a failed fsync the kernel may have dropped the pages.
            let i = &mut self.inodes[inode];
            i.data = i.durable.clone();
            i.cached.clear();
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inodes[inode].sync();
        Ok(())
    }

    fn rename_name(&mut self, name: &str, to: Option<usize>) {
        match to {
            Some(i) => self.names.insert(name.to_string(), i),
            None => self.names.remove(name),
        };
        self.name_changes.push((name.to_string(), to));
    }

    /// Runs one queued request: its ops in order, stopping at an error.
    fn run(&mut self, req: IoRequest) -> IoCompletion {
        let mut bufs = Vec::new();
        let mut result = Ok(());
        for op in req.ops {
            let step = match op {
                IoOp::Write { fd, offset, buf } => {
                    let r = self
                        .inode_of_fd(fd)
                        .and_then(|i| self.write(i, offset, buf.as_slice()));
                    bufs.push(buf);
                    r
                }
                IoOp::Fdatasync { fd } => self.inode_of_fd(fd).and_then(|i| self.sync(i)),
                IoOp::Read { fd, offset, len } => self.inode_of_fd(fd).map(|i| {
                    let mut buf = AlignedBuf::zeroed(len);
                    let data = &self.inodes[i].data;
                    let from = (offset as usize).min(data.len());
                    let to = (offset as usize + len).min(data.len());
                    buf.as_mut_slice()[..to - from].copy_from_slice(&data[from..to]);
                    bufs.push(buf);
                }),
            };
            if let Err(e) = step {
                result = Err(e);
                break;
            }
        }
        IoCompletion {
            token: req.token,
            result,
            bufs,
        }
    }

    fn crash(&mut self) {
        // Requests still queued never reached the device.
        self.queued.clear();
        self.done.clear();
        for i in 0..self.inodes.len() {
            let cached = std::mem::take(&mut self.inodes[i].cached);
            let mut kept = self.inodes[i].durable.clone();
            let mut torn = false;
            for (offset, bytes) in cached {
                if self.rng.gen_bool(0.5) {
                    put(&mut kept, offset, &bytes);
                } else if !torn && bytes.len() > SECTOR_BYTES && self.rng.gen_bool(0.3) {
                    torn = true;
                    let sectors = bytes.len().div_ceil(SECTOR_BYTES);
                    let cut = self.rng.gen_range(1..sectors) * SECTOR_BYTES;
                    put(&mut kept, offset, &bytes[..cut]);
                }
            }
            let inode = &mut self.inodes[i];
            inode.durable = kept.clone();
            inode.data = kept;
        }
        let changes = std::mem::take(&mut self.name_changes);
        let survive = self.rng.gen_range(0..=changes.len());
        let mut names = self.synced_names.clone();
        for (name, to) in changes.into_iter().take(survive) {
            match to {
                Some(i) => names.insert(name, i),
                None => names.remove(&name),
            };
        }
        self.synced_names = names.clone();
        self.names = names;
        self.fds.clear();
        self.locked = None;
        self.life += 1;
    }
}

/// A simulated device with one log directory; clones share the device.
#[derive(Clone)]
pub struct SimDir {
    dev: Arc<Mutex<Device>>,
    name: String,
}

impl SimDir {
    /// An empty device named `name`, its randomness from `seed`.
    pub fn new(name: &str, seed: u64) -> SimDir {
        let dev = Device {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now_us: 0,
            inodes: Vec::new(),
            names: BTreeMap::new(),
            synced_names: BTreeMap::new(),
            name_changes: Vec::new(),
            fds: BTreeMap::new(),
            next_fd: FD_BASE,
            life: 0,
            locked: None,
            queued: Vec::new(),
            done: VecDeque::new(),
            fail_next_sync: false,
            capacity_bytes: None,
        };
        SimDir {
            dev: Arc::new(Mutex::new(dev)),
            name: name.to_string(),
        }
    }

    fn dev(&self) -> MutexGuard<'_, Device> {
        self.dev.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power loss: see the module doc. Files and backends opened before
    /// are dead afterwards (their process is gone).
    pub fn crash(&self) {
        self.dev().crash();
    }

    /// Moves the device's clock on.
    pub fn advance_us(&self, us: u64) {
        self.dev().now_us += us;
    }

    /// The next sync (of any file) fails with EIO.
    pub fn fail_next_sync(&self) {
        self.dev().fail_next_sync = true;
    }

    /// Limits the bytes the directory's files may hold (`None`: no limit).
    pub fn set_capacity_bytes(&self, cap: Option<u64>) {
        self.dev().capacity_bytes = cap;
    }

    /// The bytes of `name` as reads see them now (tests).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        let d = self.dev();
        d.names.get(name).map(|&i| d.inodes[i].data.clone())
    }

    /// Overwrites bytes of `name` durably, as bit rot would (tests).
    pub fn rot(&self, name: &str, offset: u64, bytes: &[u8]) {
        let mut d = self.dev();
        if let Some(&i) = d.names.get(name) {
            put(&mut d.inodes[i].data, offset, bytes);
            put(&mut d.inodes[i].durable, offset, bytes);
        }
    }

    fn file(&self, inode: usize, lock: Option<String>) -> SimFile {
        let mut d = self.dev();
        let fd = d.next_fd;
        d.next_fd += 1;
        d.fds.insert(fd, inode);
        SimFile {
            dev: self.clone(),
            fd,
            life: d.life,
            lock,
        }
    }

    fn inode(&self, name: &str, create: bool) -> io::Result<usize> {
        let mut d = self.dev();
        if let Some(&i) = d.names.get(name) {
            return Ok(i);
        }
        if !create {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        d.inodes.push(Inode::default());
        let i = d.inodes.len() - 1;
        d.rename_name(name, Some(i));
        Ok(i)
    }
}

/// An open file of a [`SimDir`].
pub struct SimFile {
    dev: SimDir,
    fd: RawFd,
    life: u64,
    lock: Option<String>,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut Device, usize) -> io::Result<T>) -> io::Result<T> {
        let mut d = self.dev.dev();
        if d.life != self.life {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let i = d.inode_of_fd(self.fd)?;
        f(&mut d, i)
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut d = self.dev.dev();
        if d.life == self.life {
            d.fds.remove(&self.fd);
            if self.lock.is_some() && d.locked == self.lock {
                d.locked = None;
            }
        }
    }
}

impl LogFile for SimFile {
    fn fd(&self) -> RawFd {
        self.fd
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.with(|d, i| Ok(d.inodes[i].data.len() as u64))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|d, i| {
            let data = &d.inodes[i].data;
            let end = offset as usize + buf.len();
            if end > data.len() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buf.copy_from_slice(&data[offset as usize..end]);
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(|d, i| d.write(i, offset, buf))
    }

    fn write_back(&self, _offset: u64, _len: u64) -> io::Result<()> {
        self.with(|_, _| Ok(()))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(|d, i| d.sync(i))
    }

    fn sync_all(&self) -> io::Result<()> {
        self.with(|d, i| d.sync(i))
    }
}

impl LogDir for SimDir {
    type File = SimFile;

    fn describe(&self) -> String {
        format!("sim {}", self.name)
    }

    fn create(&self) -> io::Result<()> {
        Ok(())
    }

    fn lock(&self, name: &str) -> io::Result<SimFile> {
        let i = self.inode(name, true)?;
        {
            let mut d = self.dev();
            if d.locked.is_some() {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            d.locked = Some(name.to_string());
        }
        Ok(self.file(i, Some(name.to_string())))
    }

    fn exists(&self, name: &str) -> bool {
        self.dev().names.contains_key(name)
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.dev().names.keys().cloned().collect())
    }

    fn open(&self, name: &str, direct: bool) -> io::Result<(SimFile, bool, String)> {
        let i = self.inode(name, true)?;
        let why = if direct {
            "simulated direct writes"
        } else {
            "simulated buffered writes"
        };
        Ok((self.file(i, None), direct, why.into()))
    }

    fn create_new(&self, name: &str) -> io::Result<SimFile> {
        let i = {
            let mut d = self.dev();
            d.inodes.push(Inode::default());
            let i = d.inodes.len() - 1;
            d.rename_name(name, Some(i));
            i
        };
        Ok(self.file(i, None))
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let d = self.dev();
        let i = *d
            .names
            .get(name)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        Ok(d.inodes[i].data.clone())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut d = self.dev();
        let i = *d
            .names
            .get(from)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        d.rename_name(from, None);
        d.rename_name(to, Some(i));
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut d = self.dev();
        if !d.names.contains_key(name) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        d.rename_name(name, None);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut d = self.dev();
        d.synced_names = d.names.clone();
        d.name_changes.clear();
        Ok(())
    }

    fn backend(&self, _: BackendChoice, _: u32) -> io::Result<(Box<dyn IoBackend>, String)> {
        let life = self.dev().life;
        let backend = SimBackend {
            dev: self.clone(),
            life,
            in_flight: 0,
        };
        Ok((Box::new(backend), "simulated device".into()))
    }

    fn now_us(&self) -> u64 {
        self.dev().now_us
    }

    fn path_of(&self, _name: &str) -> Option<PathBuf> {
        None
    }

    fn jobs_inline(&self) -> bool {
        true
    }
}

/// The flush path on a [`SimDir`]: requests wait in the device's queue
/// and run one at a time, in a random order, when the WAL waits.
struct SimBackend {
    dev: SimDir,
    life: u64,
    in_flight: usize,
}

impl IoBackend for SimBackend {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn submit(&mut self, req: IoRequest) -> io::Result<()> {
        let mut d = self.dev.dev();
        if d.life != self.life {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        d.queued.push(req);
        self.in_flight += 1;
        Ok(())
    }

    fn reap(&mut self, wait: bool, out: &mut Vec<IoCompletion>) -> io::Result<()> {
        let mut d = self.dev.dev();
        if d.life != self.life {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        // A waiting caller gets one request run (any of those queued); a
        // polling one, sometimes.
        let run = !d.queued.is_empty() && (wait || d.rng.gen_bool(0.3));
        if run {
            let queued = d.queued.len();
            let pick = d.rng.gen_range(0..queued);
            let req = d.queued.swap_remove(pick);
            let c = d.run(req);
            d.done.push_back(c);
        }
        while let Some(c) = d.done.pop_front() {
            self.in_flight -= 1;
            out.push(c);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn notify_completions(&mut self, _fd: RawFd) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
