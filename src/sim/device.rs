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
//! - requests complete out of order: with a [`Latency`] set, each at its
//!   own seeded time on the device's clock (and none before a stall
//!   ends), else one at a time, at random, when the WAL polls or waits.
//!   A waiting caller gets the earliest request run at once: virtual time
//!   does not move inside a blocking call.
//!
//! For an oracle that never asks the WAL, the device tells which flushes
//! it really made durable: [`SimDir::oldest_unsynced_token`].
//!
//! Time is the device's own virtual clock, set by its user. Jobs run
//! inline (`jobs_inline`), so nothing depends on thread scheduling.

use crate::buf::AlignedBuf;
use crate::io::{BackendChoice, IoBackend, IoCompletion, IoOp, IoRequest};
use crate::storage::{LogDir, LogFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::RawFd;
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

/// How long a request takes on a device, drawn per request.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    /// The least a request takes, µs.
    pub min_us: u64,
    /// Up to this much more, uniformly, µs.
    pub jitter_us: u64,
    /// The chance a request is slow (a spike)...
    pub spike_probability: f64,
    /// ...by up to this much more, µs.
    pub spike_us_max: u64,
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
    /// Requests submitted and not yet run (with when each is due, µs),
    /// and those run and not reaped.
    queued: Vec<(u64, IoRequest)>,
    latency: Option<Latency>,
    /// Nothing completes before this (µs): a stalled device.
    stalled_until_us: u64,
    /// Tokens of the writing requests submitted in this life that have
    /// not completed with their writes synced (a failed one stays).
    unsynced: std::collections::BTreeSet<u64>,
    /// The highest token of a writing request of this life that completed
    /// with its writes synced (0: none).
    synced_max: u64,
    done: VecDeque<IoCompletion>,
    fail_next_sync: bool,
    fail_next_create: bool,
    fail_next_read: bool,
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
    /// A writing request whose every write was followed by a successful
    /// sync of its file is no longer unsynced.
    fn run(&mut self, req: IoRequest) -> IoCompletion {
        let mut bufs = Vec::new();
        let mut result = Ok(());
        let mut unsynced_files = std::collections::BTreeSet::new();
        let mut wrote = false;
        for op in req.ops {
            match &op {
                IoOp::Write { fd, .. } => {
                    wrote = true;
                    unsynced_files.insert(*fd);
                }
                IoOp::Fdatasync { fd } => {
                    unsynced_files.remove(fd);
                }
                IoOp::Read { .. } => {}
            }
            let step = match op {
                IoOp::Write { fd, offset, buf } => {
                    let r = self
                        .inode_of_fd(fd)
                        .and_then(|i| self.write(i, offset, buf.as_slice()));
                    bufs.push(buf);
                    r
                }
                IoOp::Fdatasync { fd } => self.inode_of_fd(fd).and_then(|i| self.sync(i)),
                IoOp::Read { .. } if std::mem::take(&mut self.fail_next_read) => {
                    Err(io::Error::from_raw_os_error(libc::EIO))
                }
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
        if wrote && result.is_ok() && unsynced_files.is_empty() {
            self.unsynced.remove(&req.token);
            // u64::MAX is a blocking call's request (a superblock written
            // at once), not a flush of a ticket.
            if req.token != u64::MAX {
                self.synced_max = self.synced_max.max(req.token);
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
        self.unsynced.clear();
        self.synced_max = 0;
        // A fault planted for the next sync was for the life that ended.
        self.fail_next_sync = false;
        self.fail_next_read = false;
        for i in 0..self.inodes.len() {
            // A file with nothing unsynced is what it was: no copy.
            if self.inodes[i].cached.is_empty() {
                continue;
            }
            let cached = std::mem::take(&mut self.inodes[i].cached);
            let mut torn = false;
            for (offset, bytes) in cached {
                if self.rng.gen_bool(0.5) {
                    put(&mut self.inodes[i].durable, offset, &bytes);
                } else if !torn && bytes.len() > SECTOR_BYTES && self.rng.gen_bool(0.3) {
                    torn = true;
                    let sectors = bytes.len().div_ceil(SECTOR_BYTES);
                    let cut = self.rng.gen_range(1..sectors) * SECTOR_BYTES;
                    put(&mut self.inodes[i].durable, offset, &bytes[..cut]);
                }
            }
            let inode = &mut self.inodes[i];
            inode.data.clone_from(&inode.durable);
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
            latency: None,
            stalled_until_us: 0,
            unsynced: std::collections::BTreeSet::new(),
            synced_max: 0,
            done: VecDeque::new(),
            fail_next_sync: false,
            fail_next_create: false,
            fail_next_read: false,
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

    /// Sets the device's clock (never backwards).
    pub fn set_now_us(&self, now_us: u64) {
        let mut d = self.dev();
        d.now_us = d.now_us.max(now_us);
    }

    /// Requests take `latency` each from now on (`None`: they complete at
    /// random when polled, the default).
    pub fn set_latency(&self, latency: Option<Latency>) {
        self.dev().latency = latency;
    }

    /// Nothing completes before `until_us`, unless a caller blocks.
    pub fn stall_until_us(&self, until_us: u64) {
        let mut d = self.dev();
        d.stalled_until_us = d.stalled_until_us.max(until_us);
    }

    /// When the next queued request is due (µs), if one is queued.
    pub fn next_due_us(&self) -> Option<u64> {
        let d = self.dev();
        let due = d.queued.iter().map(|(due, _)| *due).min()?;
        Some(due.max(d.stalled_until_us))
    }

    /// The lowest token of a writing request of this life that has not
    /// completed with its writes synced: every flush below it is durable
    /// on this device, whatever the WAL believes.
    pub fn oldest_unsynced_token(&self) -> Option<u64> {
        self.dev().unsynced.first().copied()
    }

    /// The highest token of a writing request of this life that the
    /// device completed with its writes synced (0: none): a flush the WAL
    /// dropped before submitting it never gets below this.
    pub fn highest_synced_token(&self) -> u64 {
        self.dev().synced_max
    }

    /// The next sync (of any file) fails with EIO.
    pub fn fail_next_sync(&self) {
        self.dev().fail_next_sync = true;
    }

    /// The next file created for writing (`create_new`: a segment being
    /// prepared) fails with EIO.
    pub fn fail_next_create(&self) {
        self.dev().fail_next_create = true;
    }

    /// The next read request on the ring (a cold read) fails with EIO.
    pub fn fail_next_read(&self) {
        self.dev().fail_next_read = true;
    }

    /// Cancels a pending [`SimDir::fail_next_sync`].
    pub fn clear_fail_next_sync(&self) {
        self.dev().fail_next_sync = false;
    }

    /// Bytes the directory's files hold now.
    pub fn used_bytes(&self) -> u64 {
        self.dev().used_bytes()
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
            if std::mem::take(&mut d.fail_next_create) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
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

    fn open_existing(&self, name: &str) -> io::Result<SimFile> {
        let i = self.inode(name, false)?;
        Ok(self.file(i, None))
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
        if req.ops.iter().any(|op| matches!(op, IoOp::Write { .. })) {
            d.unsynced.insert(req.token);
        }
        let due = match d.latency {
            None => 0,
            Some(l) => {
                let mut us = l.min_us + d.rng.gen_range(0..=l.jitter_us);
                if d.rng.gen_bool(l.spike_probability) {
                    us += d.rng.gen_range(0..=l.spike_us_max);
                }
                d.now_us + us
            }
        };
        d.queued.push((due, req));
        self.in_flight += 1;
        Ok(())
    }

    fn reap(&mut self, wait: bool, out: &mut Vec<IoCompletion>) -> io::Result<()> {
        let mut d = self.dev.dev();
        if d.life != self.life {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if d.latency.is_none() {
            // A waiting caller gets one request run (any of those queued);
            // a polling one, sometimes.
            let run = !d.queued.is_empty() && (wait || d.rng.gen_bool(0.3));
            if run {
                let queued = d.queued.len();
                let pick = d.rng.gen_range(0..queued);
                let (_, req) = d.queued.swap_remove(pick);
                let c = d.run(req);
                d.done.push_back(c);
            }
        } else {
            // Everything due runs, in the order it falls due; a waiting
            // caller with nothing due gets the earliest at once.
            let now = d.now_us;
            let ready = now >= d.stalled_until_us;
            loop {
                let next = (0..d.queued.len()).min_by_key(|&i| (d.queued[i].0, i));
                let Some(i) = next else { break };
                let due_now = ready && d.queued[i].0 <= now;
                let waited_for = wait && d.done.is_empty();
                if !(due_now || waited_for) {
                    break;
                }
                let (_, req) = d.queued.remove(i);
                let c = d.run(req);
                d.done.push_back(c);
            }
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
