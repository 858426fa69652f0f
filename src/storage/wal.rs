//! The write-ahead log of one Raft group on one disk: group commit of the
//! core's `Ready` writes through an I/O backend, recovery at open, reads by
//! index, snapshots and segment trimming. Only the thread that owns the
//! group touches its `Wal`.
//!
//! Group commit: entries accumulate in a batch while a flush is in flight;
//! the batch goes out as soon as the flush completes, or earlier once it
//! reaches `flush_bytes_max` (up to `flushes_in_flight_max` flushes at once).
//! Each flush is one request: [superblock write + fdatasync, if term or
//! vote changed], batch write + fdatasync, linked. Every call that writes
//! returns a [`Ticket`]; a ticket is durable once every flush up to it
//! completed, and `durable()` says which index that covers.
//!
//! Errors: an I/O error on a flush stops this log for good (fsync errors
//! cannot be retried: the kernel may have dropped the dirty pages). Running
//! out of space while preparing a segment stops admitting new appends until
//! space returns; nothing already written is touched.

use super::format::{align_up, decode_batch, BatchBuilder, Placement, BLOCK_BYTES};
use super::recovery::{scan, BatchLocation, Corruption, SegmentImage, TornTail};
use super::superblock::{decode_snapshot, decode_snapshot_prefix, snapshot_header, Superblock};
use crate::consensus::{Entry, HardState, Index, RestoredState, Snapshot, Term};
use crate::io::{
    open_backend, AlignedBuf, BackendChoice, IoBackend, IoCompletion, IoOp, IoRequest,
};
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Identifies a flush; see the module doc.
pub type Ticket = u64;

/// Configuration of one log.
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Size of each segment file, preallocated with zeros.
    pub segment_bytes: u64,
    /// A batch is cut, and may go out early, at this many bytes.
    pub flush_bytes_max: usize,
    /// Flushes that may be in flight at once (recovery needs the bound).
    pub flushes_in_flight_max: u32,
    /// A flush slower than this marks the disk degraded.
    pub disk_stall_ms: u64,
    /// I/O backend.
    pub backend: BackendChoice,
    /// Try O_DIRECT (falls back to buffered writes where refused).
    pub direct_io: bool,
    /// Bytes of recently read batches kept decoded.
    pub read_cache_bytes: usize,
    /// While the disk is full, how often to try preparing a segment again.
    pub space_retry_ms: u64,
    /// Spare segments kept ready ahead of the one being written; when
    /// fewer are ready, one is zero-filled in the background.
    pub segments_ahead: u32,
    /// Trimmed segments kept as spares for reuse (renamed, not rewritten)
    /// instead of being deleted; beyond this many spares they are deleted.
    pub segments_recycled_max: u32,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            segment_bytes: 64 << 20,
            flush_bytes_max: 1 << 20,
            flushes_in_flight_max: 2,
            disk_stall_ms: 2_000,
            backend: BackendChoice::Auto,
            direct_io: true,
            read_cache_bytes: 8 << 20,
            space_retry_ms: 100,
            segments_ahead: 1,
            segments_recycled_max: 4,
        }
    }
}

/// Why a log operation failed.
#[derive(Debug)]
pub enum WalError {
    /// An I/O error, with what was being done.
    Io(String, io::Error),
    /// The disk is full: new appends are not admitted until space returns.
    DiskFull,
    /// A flush failed earlier; this log is stopped on this node.
    Stopped(String),
    /// The directory holds something recovery cannot accept.
    Corrupt(String),
    /// A request the log cannot serve (entry too large, index not held).
    Invalid(String),
}

impl std::fmt::Display for WalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalError::Io(what, e) => write!(f, "{what}: {e}"),
            WalError::DiskFull => write!(f, "disk full: appends are refused until space is freed"),
            WalError::Stopped(why) => write!(f, "log stopped after an I/O error: {why}"),
            WalError::Corrupt(why) => write!(f, "log directory is damaged: {why}"),
            WalError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for WalError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> WalError {
    let what = what.into();
    move |e| WalError::Io(what, e)
}

/// Health of the log's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskState {
    /// Flushing normally.
    Healthy,
    /// A flush has taken longer than `disk_stall_ms`.
    Degraded,
    /// No space for the next segment; new appends are refused.
    Full,
    /// A write or fdatasync failed; the group stops on this node.
    Failed(String),
}

/// What `open` found.
#[derive(Debug)]
pub struct OpenReport {
    /// What the consensus core restarts from (with `repair_until` set when
    /// unrepaired corruption was found).
    pub restored: RestoredState,
    /// The torn tail discarded, if any.
    pub torn_tail: Option<TornTail>,
    /// Corruption found in the middle of the log.
    pub corruption: Vec<Corruption>,
    /// Which I/O backend is active, and why.
    pub backend: String,
    /// Whether O_DIRECT is in use, and why (not).
    pub direct_io: String,
    /// Segment files scanned.
    pub segments: usize,
    /// Bytes scanned.
    pub bytes_scanned: u64,
    /// Time recovery took.
    pub elapsed: Duration,
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = self.restored.entries.last().map_or(0, |e| e.index);
        write!(
            f,
            "recovered {} entries (to index {last}, commit {}) from {} segments, {} MiB scanned in {:.1} ms; {}; {}",
            self.restored.entries.len(),
            self.restored.hard_state.commit,
            self.segments,
            self.bytes_scanned >> 20,
            self.elapsed.as_secs_f64() * 1e3,
            self.backend,
            self.direct_io
        )?;
        if let Some(t) = &self.torn_tail {
            write!(
                f,
                "; discarded a torn tail at segment {} offset {} ({}, {} unacknowledged batches)",
                t.segment, t.offset, t.reason, t.batches_discarded
            )?;
        }
        for c in &self.corruption {
            write!(
                f,
                "; CORRUPTION at segment {} offset {} ({}): entries {}..={} {}",
                c.segment,
                c.offset,
                c.reason,
                c.lost.0,
                c.lost.1,
                if c.healed {
                    "were rewritten later"
                } else {
                    "must be fetched from a peer"
                }
            )?;
        }
        Ok(())
    }
}

/// Per-disk metrics.
pub struct WalMetrics {
    /// Latency of each flush (write + fdatasync), µs.
    pub flush_latency_us: Histogram<u64>,
    /// Records per flush.
    pub records_per_flush: Histogram<u64>,
    /// Bytes per flush.
    pub bytes_per_flush: Histogram<u64>,
    /// Flushes completed.
    pub flushes: u64,
    /// Records made durable.
    pub records: u64,
    /// Bytes written, padding included.
    pub bytes: u64,
    /// Flushes that took longer than `disk_stall_ms`.
    pub stalls: u64,
    /// Write or sync errors.
    pub io_errors: u64,
    /// Appends refused because the disk was full.
    pub disk_full_refusals: u64,
    /// Segments zero-filled, counted when started (each costs a segment's
    /// worth of writes).
    pub segments_zero_filled: u64,
    /// Trimmed segments kept for reuse instead of a zero-fill.
    pub segments_recycled: u64,
}

impl WalMetrics {
    fn new() -> Self {
        let h = || Histogram::new(3).expect("3 significant figures is valid");
        WalMetrics {
            flush_latency_us: h(),
            records_per_flush: h(),
            bytes_per_flush: h(),
            flushes: 0,
            records: 0,
            bytes: 0,
            stalls: 0,
            io_errors: 0,
            disk_full_refusals: 0,
            segments_zero_filled: 0,
            segments_recycled: 0,
        }
    }
}

struct InFlight {
    submitted: Instant,
    last: Option<(Index, Term)>,
    records: u64,
    bytes: u64,
    stalled: bool,
    done: bool,
    result: Option<io::Error>,
    latency: Duration,
}

struct Sealed {
    ticket: Ticket,
    batch: BatchBuilder,
}

/// The write-ahead log of one group.
pub struct Wal {
    dir: PathBuf,
    cfg: WalConfig,
    backend: Box<dyn IoBackend>,
    direct: bool,
    _lock: File,
    sb_file: File,
    sb: Superblock,
    sb_dirty: bool,
    segments: BTreeMap<u64, File>,
    active: u64,
    append_offset: u64,
    /// The segment being preallocated in the background, if any.
    spare: Option<(u64, JoinHandle<io::Result<()>>)>,
    /// Preallocated segments after the active one, ready to use.
    ready_spares: std::collections::BTreeSet<u64>,
    /// Spares that are recycled files (they may hold old batches).
    recycled_spares: std::collections::BTreeSet<u64>,
    /// The directory fsync after a trim, run on a thread of its own: it
    /// must be done before a recycled spare is written (its new name must
    /// be durable), not before the loop goes on.
    dir_sync: Option<JoinHandle<io::Result<()>>>,
    /// A snapshot the superblock records in a flush not yet durable: the
    /// segments it frees and the old snapshot file go once it is.
    adopting: Option<PendingAdoption>,
    /// The slot file holding the superblock's snapshot (`None`: none, or
    /// a file from before slots); the other one takes the next snapshot.
    snapshot_slot: Option<u8>,
    /// The active segment is a recycled file.
    active_recycled: bool,
    next_seq: u64,
    /// Batches cut and waiting for their flush, oldest first.
    sealed: VecDeque<Sealed>,
    /// The batch accumulating now.
    open_batch: Option<Sealed>,
    next_ticket: Ticket,
    last: (Index, Term),
    snapshot_index: Index,
    commit: Index,
    hard_state: HardState,
    in_flight: BTreeMap<Ticket, InFlight>,
    durable_ticket: Ticket,
    durable: (Index, Term),
    /// Batches holding the current log, in index order.
    index: Vec<BatchLocation>,
    cache: VecDeque<(BatchLocation, Vec<Entry>)>,
    cache_bytes: usize,
    /// Batch buffers back from the kernel, reused for the next batches.
    buf_pool: Vec<AlignedBuf>,
    state: DiskState,
    last_space_retry: Option<Instant>,
    metrics: WalMetrics,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

fn snapshot_path(dir: &Path, index: Index) -> PathBuf {
    dir.join(format!("snapshot-{index:020}.bin"))
}

/// Bytes of a snapshot file written back at a time.
const SNAPSHOT_WRITEBACK_BYTES: usize = 1 << 20;

/// The snapshot slot file `slot` (0 or 1) of a log directory.
fn slot_path(dir: &Path, slot: u8) -> PathBuf {
    dir.join(format!("snapshot.{slot}"))
}

/// Writes a snapshot into a slot file (`Wal::free_snapshot_slot`) and
/// makes it durable: header, data, CRC32C at offset 0, in place. Any
/// thread may call it; the WAL names it in the superblock only when the
/// snapshot is adopted.
///
/// Two slot files take snapshots in turn, overwritten in place rather
/// than created, renamed and unlinked: once a slot has grown (with
/// zeros, to twice what is needed, at least 1 MiB) its blocks stay
/// allocated, so the final `fdatasync` writes data alone and commits no
/// filesystem metadata; a journal commit would stall the log's own
/// `fdatasync` on the same disk. A crash mid-write damages only the slot
/// the superblock does not name.
pub fn write_snapshot_file(path: &Path, snap: &Snapshot) -> Result<(), WalError> {
    let write = || -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let header = snapshot_header(snap);
        let total = (header.len() + snap.data.len() + 4) as u64;
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::io::private::FILE_MODE)
            .open(path)?;
        let size = f.metadata()?.len();
        if size < total {
            let grown = (total * 2).max(1 << 20).next_multiple_of(1 << 20);
            let zeros = vec![0u8; 1 << 20];
            let mut at = size;
            while at < grown {
                let n = (grown - at).min(zeros.len() as u64) as usize;
                f.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            f.sync_all()?;
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
        }
        // The data is streamed, not copied into one buffer with its header.
        let crc = crc32c::crc32c_append(crc32c::crc32c(&header), &snap.data);
        let crc = crc.to_le_bytes();
        // Written back a piece at a time (sync_file_range), never tens of
        // megabytes at once: one big writeback sits in the disk's queue
        // ahead of the log's fdatasync and stalls commits for its whole
        // length; small pieces let the log's flushes in between.
        let mut at = 0u64;
        let pieces = std::iter::once(&header[..])
            .chain(snap.data.chunks(SNAPSHOT_WRITEBACK_BYTES))
            .chain(std::iter::once(&crc[..]));
        for piece in pieces {
            f.write_all_at(piece, at)?;
            let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // SAFETY: a range of a file descriptor we own; no memory is passed.
            let r = unsafe {
                libc::sync_file_range(f.as_raw_fd(), at as i64, piece.len() as i64, flags)
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            at += piece.len() as u64;
        }
        f.sync_data()
    };
    write().map_err(|e| {
        if is_enospc(&e) {
            WalError::DiskFull
        } else {
            WalError::Io("writing a snapshot".into(), e)
        }
    })
}

/// Reads the snapshot at `index` from its slot (or, from before slots, its
/// own file); `Ok(None)` if neither holds it.
fn read_snapshot(dir: &Path, index: Index) -> Result<Option<(Snapshot, Option<u8>)>, WalError> {
    for slot in 0..2u8 {
        let p = slot_path(dir, slot);
        let bytes = match fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(WalError::Io(format!("reading {}", p.display()), e)),
        };
        if let Some(s) = decode_snapshot_prefix(&bytes).filter(|s| s.index == index) {
            return Ok(Some((s, Some(slot))));
        }
    }
    let p = snapshot_path(dir, index);
    match fs::read(&p) {
        Ok(bytes) => Ok(decode_snapshot(&bytes).map(|s| (s, None))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WalError::Io(format!("reading {}", p.display()), e)),
    }
}

/// Removes a file the superblock no longer names on a thread of its own:
/// unlinking tens of megabytes frees extents for milliseconds.
fn unlink_off_the_loop(path: PathBuf) {
    let removed = std::thread::Builder::new()
        .name("quire-unlink".into())
        .spawn({
            let path = path.clone();
            move || {
                let _ = fs::remove_file(path);
            }
        });
    if removed.is_err() {
        let _ = fs::remove_file(path);
    }
}

/// See `Wal::adopt_snapshot`.
struct PendingAdoption {
    /// Durable once this ticket is.
    ticket: Ticket,
    /// Segments wholly at or below this index go then.
    upto: Index,
    /// The superblock's snapshot file from before slots (it goes then).
    old_file: Option<PathBuf>,
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes zeros over the whole file once, so later writes never allocate
/// blocks (the first write into an unwritten extent costs a journal commit).
fn preallocate(dir: &Path, id: u64, bytes: u64) -> io::Result<()> {
    let tmp = dir.join(format!("{id:016x}.seg.tmp"));
    let result = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(crate::io::private::FILE_MODE)
            .open(&tmp)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
        fs::rename(&tmp, segment_path(dir, id))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Bytes an entry takes in a batch besides its `size_bytes` (record
/// header and padding), counted when deciding where a batch is cut.
const ENTRY_DISK_OVERHEAD_BYTES: usize = 64;

/// [`Wal::entry_bytes_max`] of a log configured with `cfg`.
pub fn entry_bytes_max(cfg: &WalConfig) -> usize {
    let half_segment = usize::try_from(cfg.segment_bytes / 2).unwrap_or(usize::MAX);
    half_segment.min(super::format::ENTRY_PAYLOAD_MAX)
}

fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT)
}

impl Wal {
    /// Opens (or creates) the log in `dir`, recovering what it holds.
    pub fn open(dir: &Path, cfg: WalConfig) -> Result<(Wal, OpenReport), WalError> {
        let started = Instant::now();
        if cfg.segment_bytes < (cfg.flush_bytes_max as u64) * 2
            || cfg.segment_bytes % BLOCK_BYTES as u64 != 0
        {
            return Err(WalError::Invalid(format!(
                "segment_bytes ({}) must be a multiple of {BLOCK_BYTES} and at least twice flush_bytes_max ({})",
                cfg.segment_bytes, cfg.flush_bytes_max
            )));
        }
        crate::io::private::create_dir_all(dir)
            .map_err(io_err(format!("creating {}", dir.display())))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::io::private::FILE_MODE)
            .open(dir.join("lock"))
            .map_err(io_err("opening the lock file"))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(WalError::Invalid(format!(
                "{} is in use by another process",
                dir.display()
            )));
        }
        let (backend, backend_why) =
            open_backend(cfg.backend, 64).map_err(io_err("setting up the I/O backend"))?;

        // Superblock: two 4 KiB copies; the newer valid one wins.
        let sb_path = dir.join("superblock");
        let fresh = !sb_path.exists();
        let (sb_file, direct, direct_why) = open_data_file(&sb_path, cfg.direct_io)?;
        let sb = if fresh {
            None
        } else {
            let bytes = fs::read(&sb_path).map_err(io_err("reading the superblock"))?;
            let half = bytes.len().min(BLOCK_BYTES);
            let found = Superblock::pick(&bytes[..half], bytes.get(BLOCK_BYTES..).unwrap_or(&[]));
            Some(
                found.ok_or_else(|| {
                    WalError::Corrupt("both superblock copies are damaged".into())
                })?,
            )
        };
        let sb = sb.unwrap_or(Superblock {
            flushes_in_flight_max: cfg.flushes_in_flight_max,
            ..Superblock::default()
        });

        let (snapshot, snapshot_slot) = if sb.snapshot_index > 0 {
            let (s, slot) = read_snapshot(dir, sb.snapshot_index)?.ok_or_else(|| {
                WalError::Corrupt(format!(
                    "no undamaged snapshot at {} in {} (snapshot.0, snapshot.1)",
                    sb.snapshot_index,
                    dir.display()
                ))
            })?;
            (Some(s), slot)
        } else {
            (None, None)
        };

        // Segments, in order; leftovers of an interrupted preallocation go.
        let mut ids = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err("listing the log directory"))? {
            let entry = entry.map_err(io_err("listing the log directory"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // A snapshot file from before slots that the superblock does
            // not name (`snapshot.0`/`.1` are reused, never removed).
            let stray_snapshot = name.starts_with("snapshot-")
                && (snapshot_slot.is_some()
                    || entry.path() != snapshot_path(dir, sb.snapshot_index));
            if name.ends_with(".seg.tmp") || stray_snapshot {
                // Leftovers: a snapshot written but not adopted, or one the
                // superblock stopped naming before its removal ran.
                let _ = fs::remove_file(entry.path());
            } else if let Some(hex) = name.strip_suffix(".seg") {
                if let Ok(id) = u64::from_str_radix(hex, 16) {
                    ids.push(id);
                }
            }
        }
        ids.sort_unstable();
        // Read each segment only when the scan reaches it: recovery holds
        // one segment in memory at a time.
        let mut bytes_scanned = 0u64;
        let mut read_error = None;
        let images = ids
            .iter()
            .map_while(|&id| match fs::read(segment_path(dir, id)) {
                Ok(bytes) => {
                    bytes_scanned += bytes.len() as u64;
                    Some(SegmentImage { id, bytes })
                }
                Err(e) => {
                    read_error = Some(WalError::Io(format!("reading segment {id}"), e));
                    None
                }
            });
        let window = sb.flushes_in_flight_max.max(1) as u64;
        let found = scan(images, sb.snapshot_index, sb.hard_state.commit, window);
        if let Some(e) = read_error {
            return Err(e);
        }

        if let Some(t) = &found.torn_tail {
            zero_range(dir, &ids, t.zero_from, t.zero_until)?;
        }
        // Files after the one being written are preallocated spares.
        let (mut active, append_offset) = found
            .append_at
            .unwrap_or((ids.first().copied().unwrap_or(1), 0));
        let fresh_segment = ids.is_empty();
        if ids.is_empty() {
            preallocate(dir, 1, cfg.segment_bytes)
                .map_err(io_err("preallocating the first segment"))?;
            ids.push(1);
            active = 1;
        }
        let mut segments = BTreeMap::new();
        for &id in ids.iter().filter(|&&id| id <= active) {
            let (f, _, _) = open_data_file(&segment_path(dir, id), direct)?;
            segments.insert(id, f);
        }
        let last = found
            .entries
            .last()
            .map_or((sb.snapshot_index, sb.snapshot_term), |e| (e.index, e.term));
        let hard_state = HardState {
            commit: found.commit,
            ..sb.hard_state
        };
        let report = OpenReport {
            restored: RestoredState {
                hard_state,
                snapshot,
                entries: found.entries,
                repair_until: found.repair_until,
            },
            torn_tail: found.torn_tail,
            corruption: found.corruption,
            backend: backend_why,
            direct_io: direct_why,
            segments: ids.len(),
            bytes_scanned,
            elapsed: Duration::ZERO,
        };
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            backend,
            direct,
            _lock: lock,
            sb_file,
            sb_dirty: fresh || sb.flushes_in_flight_max != cfg.flushes_in_flight_max,
            sb: Superblock {
                flushes_in_flight_max: cfg.flushes_in_flight_max,
                ..sb
            },
            segments,
            active,
            append_offset,
            spare: None,
            ready_spares: ids.iter().copied().filter(|&id| id > active).collect(),
            // A spare that is not all zeros may hold old batches.
            recycled_spares: ids
                .iter()
                .copied()
                .filter(|&id| id > active && !found.zeroed_segments.contains(&id))
                .collect(),
            dir_sync: None,
            adopting: None,
            snapshot_slot,
            active_recycled: !fresh_segment
                && !found.zeroed_segments.contains(&active)
                && found.append_recycled,
            next_seq: found.last_seq + 1,
            sealed: VecDeque::new(),
            open_batch: None,
            next_ticket: 1,
            last,
            snapshot_index: sb.snapshot_index,
            commit: found.commit,
            hard_state,
            in_flight: BTreeMap::new(),
            durable_ticket: 0,
            durable: last,
            index: Vec::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            buf_pool: Vec::new(),
            state: DiskState::Healthy,
            last_space_retry: None,
            metrics: WalMetrics::new(),
            cfg,
        };
        // In log order: a batch rewritten from a lower index (after a
        // truncation, or entries kept with an installed snapshot) replaces
        // what the index held from there on, as it did when written.
        for b in found.batches {
            wal.note_batch_location(b);
        }
        if wal.sb_dirty {
            // Record the in-flight bound before any batch written under it.
            wal.write_superblock_now()?;
        }
        let mut report = report;
        report.elapsed = started.elapsed();
        Ok((wal, report))
    }

    // ----- writing -------------------------------------------------------

    /// Queues entries from a `Ready`: everything at or after
    /// `truncate_from` is replaced first. Returns the ticket to wait for.
    pub fn append(
        &mut self,
        truncate_from: Option<Index>,
        entries: &[Entry],
    ) -> Result<Ticket, WalError> {
        self.check_not_failed()?;
        self.check_entry_sizes(entries)?;
        let Some(first) = entries.first() else {
            if let Some(t) = truncate_from {
                self.start_batch_at(t);
            }
            return Ok(self.current_ticket());
        };
        let from = truncate_from.unwrap_or(first.index);
        assert_eq!(from, first.index, "entries start where the truncation does");
        assert!(
            from > self.snapshot_index && from <= self.last.0 + 1,
            "appends are consecutive"
        );
        if from <= self.last.0 {
            self.start_batch_at(from);
        }
        for e in entries {
            // An entry larger than `flush_bytes_max` starts a batch of its
            // own (which it fills, so it is sealed below): a batch is then
            // at most `flush_bytes_max` plus one ordinary entry, or one
            // large entry (bounded by `entry_bytes_max`, so it fits a
            // segment).
            let large = e.size_bytes() + ENTRY_DISK_OVERHEAD_BYTES > self.cfg.flush_bytes_max;
            if large
                && self
                    .open_batch
                    .as_ref()
                    .is_some_and(|b| b.batch.count() > 0)
            {
                let b = self.open_batch.take().expect("just checked");
                self.sealed.push_back(b);
            }
            let batch = self.batch_for_append(e.index);
            batch.batch.push(e);
            let full = batch.batch.disk_bytes() >= self.cfg.flush_bytes_max;
            if full {
                let b = self.open_batch.take().expect("just used");
                self.sealed.push_back(b);
            }
            self.last = (e.index, e.term);
        }
        Ok(self.current_ticket())
    }

    /// The largest entry (payload bytes) this log stores: half a segment,
    /// so that a batch holding it alone, with its headers and padding,
    /// always fits an empty segment. An entry larger than
    /// `flush_bytes_max` takes a flush of its own.
    pub fn entry_bytes_max(&self) -> usize {
        entry_bytes_max(&self.cfg)
    }

    /// Refuses entries larger than `entry_bytes_max` (before anything
    /// of the call is queued: a refused call changes nothing).
    fn check_entry_sizes(&self, entries: &[Entry]) -> Result<(), WalError> {
        let max = self.entry_bytes_max();
        match entries.iter().find(|e| e.size_bytes() > max) {
            Some(e) => Err(WalError::Invalid(format!(
                "entry {} is {} bytes, more than this log's entry_bytes_max ({max}, half of segment_bytes)",
                e.index,
                e.size_bytes(),
            ))),
            None => Ok(()),
        }
    }

    /// Records the hard state of a `Ready`. A new term or vote must be
    /// durable before dependent messages leave, so it joins the next flush;
    /// a commit index alone rides in the next batch header.
    pub fn set_hard_state(&mut self, hs: HardState) -> Result<Ticket, WalError> {
        self.check_not_failed()?;
        self.commit = self.commit.max(hs.commit);
        let changed = hs.term != self.hard_state.term || hs.vote != self.hard_state.vote;
        self.hard_state = HardState {
            commit: self.commit,
            ..hs
        };
        if changed {
            self.sb_dirty = true;
            if self.open_batch.is_none() && self.sealed.is_empty() {
                let at = self.last.0 + 1;
                let ticket = self.take_ticket();
                let batch = self.new_batch(at);
                self.open_batch = Some(Sealed { ticket, batch });
            }
        }
        Ok(self.current_ticket())
    }

    /// Refuses new client appends while the disk is full or failed.
    pub fn admit(&mut self) -> Result<(), WalError> {
        self.check_not_failed()?;
        if self.state == DiskState::Full {
            // Space may have returned: the waiting batch retries a segment.
            self.submit_ready()?;
        }
        if self.state == DiskState::Full {
            self.metrics.disk_full_refusals += 1;
            return Err(WalError::DiskFull);
        }
        Ok(())
    }

    fn check_not_failed(&self) -> Result<(), WalError> {
        match &self.state {
            DiskState::Failed(why) => Err(WalError::Stopped(why.clone())),
            _ => Ok(()),
        }
    }

    fn take_ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// The ticket covering everything queued so far.
    pub fn current_ticket(&self) -> Ticket {
        self.next_ticket - 1
    }

    fn start_batch_at(&mut self, first_index: Index) {
        if let Some(b) = self.open_batch.take() {
            self.sealed.push_back(b);
        }
        let ticket = self.take_ticket();
        let batch = self.new_batch(first_index);
        self.open_batch = Some(Sealed { ticket, batch });
        // Cached reads of the replaced suffix are stale now.
        self.cache
            .retain(|(loc, _)| loc.first_index + loc.count <= first_index);
        self.last = (first_index - 1, self.last.1);
    }

    /// A batch built in a recycled buffer when one is free.
    fn new_batch(&mut self, first_index: Index) -> BatchBuilder {
        let buf = self
            .buf_pool
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(self.cfg.flush_bytes_max + (64 << 10)));
        BatchBuilder::with_buffer(first_index, buf)
    }

    /// Keeps a few batch-sized buffers for reuse.
    fn recycle(&mut self, bufs: Vec<AlignedBuf>) {
        for b in bufs {
            // A buffer grown for one large entry is not kept: the pool
            // holds batch-sized buffers only.
            let batch_sized = b.capacity() >= self.cfg.flush_bytes_max
                && b.capacity() <= 2 * self.cfg.flush_bytes_max + (64 << 10);
            if batch_sized && self.buf_pool.len() < 8 {
                self.buf_pool.push(b);
            }
        }
    }

    fn batch_for_append(&mut self, index: Index) -> &mut Sealed {
        if self.open_batch.is_none() {
            let ticket = self.take_ticket();
            let batch = self.new_batch(index);
            self.open_batch = Some(Sealed { ticket, batch });
        }
        self.open_batch.as_mut().expect("just ensured")
    }

    /// Submits what group commit allows and collects finished flushes,
    /// without blocking. Call after every `Ready` and on every wake-up.
    pub fn poll(&mut self) -> Result<(), WalError> {
        self.reap(false)?;
        self.finish_adoption()?;
        self.collect_spare(false)?;
        self.top_up_spares();
        self.submit_ready()?;
        self.check_stall();
        Ok(())
    }

    /// Blocks until at least one flush finishes (if any is in flight),
    /// then submits what may go next.
    pub fn wait(&mut self) -> Result<(), WalError> {
        self.submit_ready()?;
        self.reap(true)?;
        self.submit_ready()
    }

    /// Flushes everything queued and waits until it is durable.
    pub fn sync(&mut self) -> Result<(), WalError> {
        let target = self.current_ticket();
        while self.durable_ticket < target {
            self.check_not_failed()?;
            self.submit_ready()?; // also retries a segment when full
            if self.state == DiskState::Full && self.backend.in_flight() == 0 {
                return Err(WalError::DiskFull);
            }
            self.wait()?;
        }
        self.check_not_failed()?;
        self.finish_adoption()
    }

    fn submit_ready(&mut self) -> Result<(), WalError> {
        if matches!(self.state, DiskState::Failed(_)) {
            return Ok(());
        }
        loop {
            let in_flight = self.in_flight.len();
            if in_flight >= self.cfg.flushes_in_flight_max as usize {
                return Ok(());
            }
            // A sealed (full) batch may go while another flush runs; the
            // open one waits for the disk to be idle, gathering more.
            let next = if !self.sealed.is_empty() {
                self.sealed.pop_front()
            } else if in_flight == 0 && (self.open_batch.is_some() || self.sb_dirty) {
                self.open_batch.take().or_else(|| {
                    let at = self.last.0 + 1;
                    let ticket = self.take_ticket();
                    let batch = self.new_batch(at);
                    Some(Sealed { ticket, batch })
                })
            } else {
                None
            };
            let Some(s) = next else {
                return Ok(());
            };
            if let Err(back) = self.submit_flush(s)? {
                self.sealed.push_front(back); // no room yet: retried later
                return Ok(());
            }
        }
    }

    /// Submits one flush; gives the batch back if no segment has room.
    fn submit_flush(&mut self, s: Sealed) -> Result<Result<(), Sealed>, WalError> {
        let empty = s.batch.count() == 0;
        let mut ops = Vec::with_capacity(4);
        let mut loc = None;
        let (last, records) = (s.batch.last(), s.batch.count() as u64);
        let mut bytes = 0u64;
        // An empty batch still records a truncation if it starts inside the
        // log; one that only carries the superblock is skipped.
        let writes_batch = !empty || s.batch.first_index() <= self.durable_end();
        if writes_batch {
            let len = s.batch.disk_bytes() as u64;
            if self.append_offset + len > self.cfg.segment_bytes && !self.roll_segment()? {
                return Ok(Err(s));
            }
            let first_index = s.batch.first_index();
            let seq = self.next_seq;
            self.next_seq += 1;
            let place = Placement {
                segment: self.active,
                recycled: self.active_recycled,
            };
            let data = s.batch.finish(seq, self.commit, place);
            let fd = self.segments[&self.active].as_raw_fd();
            let l = BatchLocation {
                segment: self.active,
                offset: self.append_offset,
                disk_bytes: len,
                seq,
                first_index,
                count: records,
                recycled: self.active_recycled,
            };
            self.append_offset += len;
            bytes = len;
            loc = Some(l);
            if self.sb_dirty {
                self.push_superblock_ops(&mut ops);
            }
            ops.push(IoOp::Write {
                fd,
                offset: l.offset,
                buf: data,
            });
            ops.push(IoOp::Fdatasync { fd });
        } else if self.sb_dirty {
            self.push_superblock_ops(&mut ops);
        } else {
            // Nothing to write: the ticket is durable once earlier ones are.
            self.in_flight.insert(s.ticket, InFlight::done_now(last));
            self.advance_durable();
            return Ok(Ok(()));
        }
        if let Some(l) = loc {
            self.note_batch_location(l);
        }
        self.backend
            .submit(IoRequest {
                token: s.ticket,
                ops,
            })
            .map_err(io_err("submitting a flush"))?;
        self.in_flight.insert(
            s.ticket,
            InFlight {
                submitted: Instant::now(),
                last,
                records,
                bytes,
                stalled: false,
                done: false,
                result: None,
                latency: Duration::ZERO,
            },
        );
        Ok(Ok(()))
    }

    fn durable_end(&self) -> Index {
        self.last.0.max(self.durable.0)
    }

    fn push_superblock_ops(&mut self, ops: &mut Vec<IoOp>) {
        self.sb.seq += 1;
        self.sb.hard_state = HardState {
            commit: self.commit,
            ..self.hard_state
        };
        let fd = self.sb_file.as_raw_fd();
        ops.push(IoOp::Write {
            fd,
            offset: self.sb.slot_offset(),
            buf: AlignedBuf::from_slice(&self.sb.encode()),
        });
        ops.push(IoOp::Fdatasync { fd });
        self.sb_dirty = false;
    }

    /// Keeps the index in log order: a batch replaces everything from its
    /// first index on.
    fn note_batch_location(&mut self, l: BatchLocation) {
        while let Some(b) = self.index.last_mut() {
            if b.first_index >= l.first_index {
                self.index.pop();
            } else {
                b.count = b.count.min(l.first_index - b.first_index);
                break;
            }
        }
        if l.count > 0 {
            self.index.push(l);
        }
    }

    /// Moves writing to the next segment; false if there is no space for
    /// one (the disk is full).
    fn roll_segment(&mut self) -> Result<bool, WalError> {
        // The lowest ready spare; else wait for the one being prepared;
        // else prepare one now.
        self.collect_spare(self.ready_spares.is_empty())?;
        // A recycled or renumbered spare's new name must be durable before
        // it is written: recovery orders segments by name.
        self.finish_dir_sync()?;
        let ready = self.ready_spares.pop_first();
        let next = ready.unwrap_or_else(|| self.highest_segment_id() + 1);
        if ready.is_none() {
            let now = Instant::now();
            if self.state == DiskState::Full
                && self.last_space_retry.is_some_and(|t| {
                    now.duration_since(t) < Duration::from_millis(self.cfg.space_retry_ms)
                })
            {
                return Ok(false);
            }
            self.last_space_retry = Some(now);
            match preallocate(&self.dir, next, self.cfg.segment_bytes) {
                Ok(()) => {}
                Err(e) if is_enospc(&e) => {
                    self.state = DiskState::Full;
                    return Ok(false);
                }
                Err(e) => return Err(WalError::Io(format!("preallocating segment {next}"), e)),
            }
            self.metrics.segments_zero_filled += 1;
        }
        // Recovery reads segments in the order of their numbers: writing
        // into a lower one would put newer batches before older ones.
        assert!(
            next > self.active && self.segments.keys().all(|&id| id < next),
            "segment {next} would be written after segment {}",
            self.active
        );
        let (f, _, _) = open_data_file(&segment_path(&self.dir, next), self.direct)?;
        self.segments.insert(next, f);
        self.active = next;
        self.active_recycled = self.recycled_spares.remove(&next);
        self.append_offset = 0;
        if self.state == DiskState::Full {
            self.state = DiskState::Healthy;
        }
        self.top_up_spares();
        Ok(true)
    }

    /// Collects a finished background preallocation (waiting for it with
    /// `block`). Running out of space there is not an error yet: the roll
    /// that needs the segment will find out.
    /// Waits for the log's background work to finish: a spare segment
    /// being preallocated, a directory sync. Call before removing the
    /// log's directory (a spare's thread would write into it after).
    pub fn quiesce(&mut self) -> Result<(), WalError> {
        self.collect_spare(true)?;
        self.finish_dir_sync()
    }

    /// Waits for the background directory fsync, if one runs.
    fn finish_dir_sync(&mut self) -> Result<(), WalError> {
        match self.dir_sync.take() {
            None => Ok(()),
            Some(job) => job
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the directory sync thread panicked")))
                .map_err(io_err("syncing the log directory")),
        }
    }

    /// Starts a directory fsync off the loop (after a rename): right after
    /// a snapshot the journal is busy and one can take many milliseconds.
    /// `roll_segment` waits for it before writing into a renamed spare.
    fn start_dir_sync(&mut self) -> Result<(), WalError> {
        self.finish_dir_sync()?;
        let dir = self.dir.clone();
        match std::thread::Builder::new()
            .name("quire-dirsync".into())
            .spawn(move || sync_dir(&dir))
        {
            Ok(job) => self.dir_sync = Some(job),
            Err(_) => sync_dir(&self.dir).map_err(io_err("syncing the log directory"))?,
        }
        Ok(())
    }

    fn collect_spare(&mut self, block: bool) -> Result<(), WalError> {
        let finished = self
            .spare
            .as_ref()
            .is_some_and(|(_, job)| job.is_finished());
        if !(block || finished) {
            return Ok(());
        }
        if let Some((id, job)) = self.spare.take() {
            match job.join() {
                Ok(Ok(())) => {
                    // Segments must be written in the order of their
                    // numbers (recovery reads them so). A trim may have
                    // recycled files under higher numbers while this one
                    // was being prepared, and the roll may have used one:
                    // then this spare is renumbered past them.
                    let highest = self.highest_segment_id();
                    let id = if id < highest {
                        let to = highest + 1;
                        fs::rename(segment_path(&self.dir, id), segment_path(&self.dir, to))
                            .map_err(io_err("renumbering a spare segment"))?;
                        self.start_dir_sync()?;
                        to
                    } else {
                        id
                    };
                    self.ready_spares.insert(id);
                }
                Ok(Err(e)) if is_enospc(&e) => {}
                Ok(Err(e)) => return Err(WalError::Io(format!("preallocating segment {id}"), e)),
                Err(_) => {
                    return Err(WalError::Invalid(
                        "the preallocation thread panicked".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Starts preparing the next spare in the background if fewer than
    /// `segments_ahead` are ready (one preparation at a time).
    fn top_up_spares(&mut self) {
        if self.spare.is_some() || self.ready_spares.len() >= self.cfg.segments_ahead as usize {
            return;
        }
        self.start_zero_fill();
    }

    /// Starts zero-filling a new spare segment in the background.
    fn start_zero_fill(&mut self) {
        let id = self.highest_segment_id() + 1;
        let (dir, bytes) = (self.dir.clone(), self.cfg.segment_bytes);
        self.metrics.segments_zero_filled += 1;
        self.spare = Some((id, std::thread::spawn(move || preallocate(&dir, id, bytes))));
    }

    /// The highest segment number in use: written, spare or being prepared.
    fn highest_segment_id(&self) -> u64 {
        let spares = self.ready_spares.last().copied().unwrap_or(0);
        let preparing = self.spare.as_ref().map_or(0, |(id, _)| *id);
        let written = self.segments.keys().last().copied().unwrap_or(0);
        self.active.max(spares).max(preparing).max(written)
    }

    /// Preallocates spare segments now, blocking, until `count` are ready:
    /// at start-up, so that the first minutes of appends never wait for
    /// one (and, in benchmarks, as fio lays out its file before timing).
    pub fn prepare_segments(&mut self, count: u32) -> Result<(), WalError> {
        loop {
            self.collect_spare(true)?;
            if self.ready_spares.len() >= count as usize {
                return Ok(());
            }
            let before = self.ready_spares.len();
            self.start_zero_fill();
            self.collect_spare(true)?;
            if self.ready_spares.len() == before {
                return Err(WalError::DiskFull);
            }
        }
    }

    fn reap(&mut self, wait: bool) -> Result<(), WalError> {
        let mut done: Vec<IoCompletion> = Vec::new();
        self.backend
            .reap(wait, &mut done)
            .map_err(io_err("collecting completions"))?;
        for c in done {
            let Some(f) = self.in_flight.get_mut(&c.token) else {
                continue; // a read, handled by its caller
            };
            f.done = true;
            f.latency = c.submitted.elapsed();
            if let Err(e) = c.result {
                f.result = Some(e);
            }
            self.recycle(c.bufs);
        }
        self.advance_durable();
        self.check_not_failed()
    }

    /// Durability is reported in ticket order: a later flush completing
    /// first does not make earlier ones durable.
    fn advance_durable(&mut self) {
        while let Some((&t, f)) = self.in_flight.first_key_value() {
            if !f.done {
                break;
            }
            let f = self.in_flight.remove(&t).expect("present");
            if let Some(e) = f.result {
                // Never retried: after a failed fsync the kernel may have
                // dropped the dirty pages, so a retry could report success
                // for data that is gone.
                self.metrics.io_errors += 1;
                self.state = DiskState::Failed(format!("flush {t} failed: {e}"));
                return;
            }
            if f.bytes > 0 || f.records > 0 {
                self.metrics.flushes += 1;
                self.metrics.records += f.records;
                self.metrics.bytes += f.bytes;
                let us = f.latency.as_micros() as u64;
                let _ = self.metrics.flush_latency_us.record(us.max(1));
                let _ = self.metrics.records_per_flush.record(f.records.max(1));
                let _ = self.metrics.bytes_per_flush.record(f.bytes.max(1));
            }
            self.durable_ticket = t;
            if let Some(last) = f.last {
                self.durable = last;
            }
        }
        if self.state == DiskState::Degraded && self.in_flight.values().all(|f| !f.stalled) {
            self.state = DiskState::Healthy;
        }
    }

    /// A flush outstanding for longer than `disk_stall_ms` marks the disk
    /// degraded (counted once per flush) until no stalled flush remains.
    fn check_stall(&mut self) {
        let limit = Duration::from_millis(self.cfg.disk_stall_ms);
        let mut newly = 0;
        for f in self.in_flight.values_mut() {
            if !f.done && !f.stalled && f.submitted.elapsed() >= limit {
                f.stalled = true;
                newly += 1;
            }
        }
        if newly > 0 {
            self.metrics.stalls += newly;
            if self.state == DiskState::Healthy {
                self.state = DiskState::Degraded;
            }
        }
    }

    // ----- state -----------------------------------------------------------

    /// Highest ticket durable.
    pub fn durable_ticket(&self) -> Ticket {
        self.durable_ticket
    }

    /// Index and term of the last durable entry.
    pub fn durable(&self) -> (Index, Term) {
        self.durable
    }

    /// Index and term of the last entry queued.
    pub fn last(&self) -> (Index, Term) {
        self.last
    }

    /// Disk health.
    pub fn state(&self) -> &DiskState {
        &self.state
    }

    /// Metrics of this disk.
    pub fn metrics(&self) -> &WalMetrics {
        &self.metrics
    }

    /// Flushes in flight (the disk's queue depth as quire sees it).
    pub fn queue_depth(&self) -> usize {
        self.in_flight.len()
    }

    /// Name of the active I/O backend.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// From now on, every completed flush also signals the eventfd `fd`
    /// (the node's loop waits on it).
    pub fn notify_completions(&mut self, fd: std::os::fd::RawFd) -> Result<(), WalError> {
        self.backend
            .notify_completions(fd)
            .map_err(io_err("registering the completion eventfd"))
    }

    /// Whether O_DIRECT is in use.
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    // ----- snapshots ---------------------------------------------------------

    /// The core compacted its log into `snap`: store it, record it in the
    /// superblock, and delete whole segments it covers. Synchronous:
    /// snapshots hold metadata only and are rare.
    pub fn compact(&mut self, snap: &Snapshot) -> Result<(), WalError> {
        self.sync()?;
        self.store_snapshot(snap)?;
        self.trim_segments(snap.index)
    }

    /// The core installed a snapshot from its leader, replacing its whole
    /// log: store it and start the log afresh after it. `below` are the
    /// entries at or below the snapshot that its state refers to
    /// (consecutive, ending at most at its index): they go first into the
    /// fresh segment, durable before the snapshot is recorded, so a crash
    /// in between leaves the old snapshot and log in force.
    pub fn install_snapshot(&mut self, snap: &Snapshot, below: &[Entry]) -> Result<(), WalError> {
        let consecutive = below.windows(2).all(|w| w[1].index == w[0].index + 1);
        if !consecutive || below.last().is_some_and(|e| e.index > snap.index) {
            return Err(WalError::Invalid(format!(
                "the entries kept with the snapshot at {} are not consecutive up to it",
                snap.index
            )));
        }
        self.check_entry_sizes(below)?;
        self.sync()?;
        self.commit = self.commit.max(snap.index);
        // Every old segment goes; a fresh one starts the new log.
        if let Some((id, job)) = self.spare.take() {
            let _ = job.join();
            let _ = fs::remove_file(segment_path(&self.dir, id));
        }
        for id in std::mem::take(&mut self.ready_spares) {
            let _ = fs::remove_file(segment_path(&self.dir, id));
        }
        self.recycled_spares.clear();
        let old: Vec<u64> = self.segments.keys().copied().collect();
        // Past every existing file, spares preallocated earlier included.
        let next = old.last().map_or(self.active, |&m| m.max(self.active)) + 1;
        preallocate(&self.dir, next, self.cfg.segment_bytes).map_err(|e| {
            if is_enospc(&e) {
                WalError::DiskFull
            } else {
                WalError::Io("preallocating a segment".into(), e)
            }
        })?;
        let (f, _, _) = open_data_file(&segment_path(&self.dir, next), self.direct)?;
        self.segments.insert(next, f);
        self.active = next;
        self.active_recycled = false;
        self.append_offset = 0;
        self.index.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        if let Some(first) = below.first() {
            // Written as appends are, after everything in the old log
            // (higher segment and sequence numbers): recovery reads them
            // as a rewrite from `first`, which is what they are.
            self.start_batch_at(first.index);
            for e in below {
                let batch = self.batch_for_append(e.index);
                batch.batch.push(e);
                if batch.batch.disk_bytes() >= self.cfg.flush_bytes_max {
                    let b = self.open_batch.take().expect("just used");
                    self.sealed.push_back(b);
                }
                self.last = (e.index, e.term);
            }
            self.sync()?;
        }
        self.store_snapshot(snap)?;
        for id in old {
            self.segments.remove(&id);
            fs::remove_file(segment_path(&self.dir, id)).map_err(io_err("removing a segment"))?;
        }
        sync_dir(&self.dir).map_err(io_err("syncing the log directory"))?;
        self.last = (snap.index, snap.term);
        self.durable = self.last;
        Ok(())
    }

    fn store_snapshot(&mut self, snap: &Snapshot) -> Result<(), WalError> {
        write_snapshot_file(&self.free_snapshot_slot(), snap)?;
        self.record_snapshot(snap.index, snap.term)
    }

    /// The slot file the next snapshot is written to: the one the
    /// superblock does not name. One writer at a time: the caller writes
    /// it, then adopts what it wrote, before another snapshot (or an
    /// install) is written.
    pub fn free_snapshot_slot(&self) -> PathBuf {
        slot_path(&self.dir, self.snapshot_slot.map_or(0, |s| 1 - s))
    }

    /// Points the log at the free slot's snapshot; a file from before
    /// slots that the superblock named goes once it no longer does.
    fn take_free_slot(&mut self) -> Option<PathBuf> {
        let legacy = (self.snapshot_slot.is_none() && self.snapshot_index > 0)
            .then(|| snapshot_path(&self.dir, self.snapshot_index));
        self.snapshot_slot = Some(self.snapshot_slot.map_or(0, |s| 1 - s));
        legacy
    }

    /// Makes the snapshot file `write_snapshot_file` wrote (on another
    /// thread) the log's snapshot, and trims the segments below it, but
    /// none holding an entry at or after `keep_from` (the lowest index
    /// whose bytes the snapshot's state still refers to).
    ///
    /// Without waiting, when the log is durable up to `index` (the caller
    /// waits for that, `durable()`): the superblock naming the snapshot
    /// rides in the next flush, and the trim and the old snapshot file's
    /// removal follow once that flush is durable (`poll`, `sync`). Else
    /// everything is made durable first, blocking.
    pub fn adopt_snapshot(
        &mut self,
        index: Index,
        term: Term,
        keep_from: Option<Index>,
    ) -> Result<(), WalError> {
        if index <= self.snapshot_index {
            return Ok(()); // its slot is simply written over next time
        }
        if self.durable.0 < index || self.adopting.is_some() {
            // The state may refer to entries up to `index`: they must be
            // durable before the superblock names a snapshot that needs them.
            self.sync()?;
        }
        let old_file = self.take_free_slot();
        self.sb.snapshot_index = index;
        self.sb.snapshot_term = term;
        self.snapshot_index = index;
        self.sb_dirty = true;
        if self.open_batch.is_none() && self.sealed.is_empty() {
            // An empty batch carries the superblock alone.
            let ticket = self.take_ticket();
            let batch = self.new_batch(self.last.0 + 1);
            self.open_batch = Some(Sealed { ticket, batch });
        }
        self.adopting = Some(PendingAdoption {
            ticket: self.current_ticket(),
            upto: keep_from.map_or(index, |k| index.min(k.saturating_sub(1))),
            old_file,
        });
        self.submit_ready()
    }

    /// Finishes an adoption whose superblock is durable: removes the old
    /// snapshot file and trims the segments it frees.
    fn finish_adoption(&mut self) -> Result<(), WalError> {
        let Some(p) = &self.adopting else {
            return Ok(());
        };
        if self.durable_ticket < p.ticket {
            return Ok(());
        }
        let p = self.adopting.take().expect("checked above");
        if let Some(old) = p.old_file {
            unlink_off_the_loop(old);
        }
        self.trim_segments(p.upto)
    }

    /// Names the snapshot just written to the free slot in the
    /// superblock, durably, now.
    fn record_snapshot(&mut self, index: Index, term: Term) -> Result<(), WalError> {
        let old_file = self.take_free_slot();
        self.sb.snapshot_index = index;
        self.sb.snapshot_term = term;
        self.snapshot_index = index;
        self.write_superblock_now()?;
        if let Some(old) = old_file {
            unlink_off_the_loop(old);
        }
        Ok(())
    }

    fn write_superblock_now(&mut self) -> Result<(), WalError> {
        let mut ops = Vec::new();
        self.sb_dirty = true;
        self.push_superblock_ops(&mut ops);
        self.run_now(ops).map(|_| ())
    }

    /// Runs a request and waits for it, handling other completions.
    fn run_now(&mut self, ops: Vec<IoOp>) -> Result<Vec<AlignedBuf>, WalError> {
        const TOKEN: u64 = u64::MAX;
        self.backend
            .submit(IoRequest { token: TOKEN, ops })
            .map_err(io_err("submitting a request"))?;
        loop {
            let mut done = Vec::new();
            self.backend
                .reap(true, &mut done)
                .map_err(io_err("collecting completions"))?;
            let mut mine = None;
            for c in done {
                if c.token == TOKEN {
                    mine = Some(c);
                } else if let Some(f) = self.in_flight.get_mut(&c.token) {
                    f.done = true;
                    f.latency = c.submitted.elapsed();
                    f.result = c.result.err();
                }
            }
            self.advance_durable();
            if let Some(c) = mine {
                return match c.result {
                    Ok(()) => Ok(c.bufs),
                    Err(e) => {
                        self.metrics.io_errors += 1;
                        self.state = DiskState::Failed(format!("{e}"));
                        Err(WalError::Stopped(format!("{e}")))
                    }
                };
            }
        }
    }

    fn trim_segments(&mut self, upto: Index) -> Result<(), WalError> {
        let mut last_in_segment: BTreeMap<u64, Index> = BTreeMap::new();
        for b in &self.index {
            let e = last_in_segment.entry(b.segment).or_insert(0);
            *e = (*e).max(b.first_index + b.count.max(1) - 1);
        }
        let doomed: Vec<u64> = self
            .segments
            .keys()
            .copied()
            .filter(|id| *id != self.active && last_in_segment.get(id).is_none_or(|&l| l <= upto))
            .collect();
        for id in &doomed {
            self.segments.remove(id);
            let path = segment_path(&self.dir, *id);
            if self.ready_spares.len() < self.cfg.segments_recycled_max as usize {
                // Reused under a new, higher number: its old batches name
                // the old number, so recovery reads them as free space.
                let new_id = self.highest_segment_id() + 1;
                fs::rename(&path, segment_path(&self.dir, new_id))
                    .map_err(io_err("recycling a segment"))?;
                self.ready_spares.insert(new_id);
                self.recycled_spares.insert(new_id);
                self.metrics.segments_recycled += 1;
            } else {
                fs::remove_file(&path).map_err(io_err("removing a segment"))?;
            }
        }
        if !doomed.is_empty() {
            self.start_dir_sync()?;
        }
        self.index.retain(|b| !doomed.contains(&b.segment));
        Ok(())
    }

    // ----- reads -------------------------------------------------------------

    /// The batch holding entry `index`, if the log has it.
    fn batch_at(&self, index: Index) -> Option<BatchLocation> {
        let pos = self.index.partition_point(|b| b.first_index <= index);
        let loc = self.index[pos.checked_sub(1)?];
        (index < loc.first_index + loc.count).then_some(loc)
    }

    fn batch_at_or_err(&self, index: Index) -> Result<BatchLocation, WalError> {
        self.batch_at(index)
            .ok_or_else(|| WalError::Invalid(format!("index {index} is not in the log")))
    }

    /// True if the log holds entry `index` in a batch it can read.
    pub fn holds(&self, index: Index) -> bool {
        self.batch_at(index).is_some()
    }

    /// Where the durable entries `lo..=hi` are: each batch's file and
    /// place, for [`read_located`] to read them on another thread.
    pub fn locate(&self, lo: Index, hi: Index) -> Result<Vec<(PathBuf, BatchLocation)>, WalError> {
        if hi > self.durable.0 {
            return Err(WalError::Invalid(format!("index {hi} is not durable")));
        }
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            let loc = self.batch_at_or_err(i)?;
            out.push((segment_path(&self.dir, loc.segment), loc));
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    /// Entries `lo..=hi` that are durable, read from the segments through
    /// the backend (with a small cache of recently read batches).
    pub fn read(&mut self, lo: Index, hi: Index) -> Result<Vec<Entry>, WalError> {
        let hi = hi.min(self.durable.0);
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            let loc = self.batch_at_or_err(i)?;
            let entries = self.read_batch(loc)?;
            for e in entries.iter().filter(|e| e.index >= i && e.index <= hi) {
                out.push(e.clone());
            }
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    fn read_batch(&mut self, loc: BatchLocation) -> Result<Vec<Entry>, WalError> {
        if let Some((_, e)) = self.cache.iter().find(|(l, _)| *l == loc) {
            return Ok(e.clone());
        }
        let fd = self.segments[&loc.segment].as_raw_fd();
        let len = align_up(loc.disk_bytes as usize);
        let bufs = self.run_now(vec![IoOp::Read {
            fd,
            offset: loc.offset,
            len,
        }])?;
        let batch = decode_batch(bufs[0].as_slice()).map_err(|e| {
            WalError::Corrupt(format!(
                "segment {} offset {}: {e} while reading entries from {}",
                loc.segment, loc.offset, loc.first_index
            ))
        })?;
        let mut entries = batch.entries;
        entries.truncate(loc.count as usize);
        self.cache_bytes += loc.disk_bytes as usize;
        self.cache.push_back((loc, entries.clone()));
        while self.cache_bytes > self.cfg.read_cache_bytes {
            match self.cache.pop_front() {
                Some((l, _)) => self.cache_bytes -= l.disk_bytes as usize,
                None => break,
            }
        }
        Ok(entries)
    }
}

/// Reads the entries `lo..=hi` from the batches [`Wal::locate`] named,
/// with plain file reads, on any thread. A batch that no longer holds what
/// was located (its segment was trimmed and reused meanwhile) is an error,
/// never other entries.
pub fn read_located(
    located: &[(PathBuf, BatchLocation)],
    lo: Index,
    hi: Index,
) -> Result<Vec<Entry>, WalError> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let mut open: Option<(&Path, File)> = None;
    for (path, loc) in located {
        if open.as_ref().is_none_or(|(p, _)| p != path) {
            let f = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
            open = Some((path, f));
        }
        let (_, f) = open.as_ref().expect("just opened");
        let mut buf = vec![0u8; loc.disk_bytes as usize];
        f.read_exact_at(&mut buf, loc.offset)
            .map_err(io_err(format!("reading {}", path.display())))?;
        let moved = || {
            WalError::Corrupt(format!(
                "segment {} offset {} no longer holds entries from {}",
                loc.segment, loc.offset, loc.first_index
            ))
        };
        let batch = decode_batch(&buf).map_err(|_| moved())?;
        if (batch.seq, batch.first_index, batch.place.segment)
            != (loc.seq, loc.first_index, loc.segment)
        {
            return Err(moved());
        }
        let end = loc.first_index + loc.count;
        out.extend(
            batch
                .entries
                .into_iter()
                .filter(|e| e.index >= lo && e.index <= hi && e.index < end),
        );
    }
    Ok(out)
}

impl InFlight {
    fn done_now(last: Option<(Index, Term)>) -> Self {
        InFlight {
            submitted: Instant::now(),
            last,
            records: 0,
            bytes: 0,
            stalled: false,
            done: true,
            result: None,
            latency: Duration::ZERO,
        }
    }
}

/// Opens a data file read-write, with O_DIRECT if wanted and accepted.
/// Returns the file, whether O_DIRECT is on, and why.
fn open_data_file(path: &Path, want_direct: bool) -> Result<(File, bool, String), WalError> {
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
                let f = base()
                    .open(path)
                    .map_err(io_err(format!("opening {}", path.display())))?;
                return Ok((
                    f,
                    false,
                    "buffered writes + fdatasync (the filesystem refuses O_DIRECT)".into(),
                ));
            }
            Err(e) => return Err(WalError::Io(format!("opening {}", path.display()), e)),
        }
    }
    let f = base()
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    Ok((
        f,
        false,
        "buffered writes + fdatasync (O_DIRECT off by configuration)".into(),
    ))
}

/// Zeroes `from..until` across segments, then syncs: what a torn tail
/// left behind must not be read as data by a later scan.
fn zero_range(
    dir: &Path,
    ids: &[u64],
    from: (u64, u64),
    until: (u64, u64),
) -> Result<(), WalError> {
    for &id in ids.iter().filter(|&&id| id >= from.0 && id <= until.0) {
        let path = segment_path(dir, id);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_err("opening a segment to zero"))?;
        let len = f.metadata().map_err(io_err("sizing a segment"))?.len();
        let start = if id == from.0 { from.1 } else { 0 };
        let end = if id == until.0 { until.1.min(len) } else { len };
        if end > start {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&vec![0u8; (end - start) as usize], start)
                .map_err(io_err("zeroing a torn tail"))?;
            f.sync_data().map_err(io_err("syncing a zeroed tail"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consensus::{Membership, Payload};
    use std::sync::mpsc;

    fn small_cfg() -> WalConfig {
        WalConfig {
            segment_bytes: 64 << 10,
            flush_bytes_max: 16 << 10,
            backend: BackendChoice::Portable,
            direct_io: false,
            ..WalConfig::default()
        }
    }

    /// Appends `n` entries of about 3 KiB after the last one, durably.
    fn append_durably(wal: &mut Wal, n: u64) {
        let first = wal.last().0 + 1;
        for i in first..first + n {
            let entry = Entry {
                term: 1,
                index: i,
                payload: Payload::Normal(vec![i as u8; 3000]),
            };
            wal.append(None, &[entry]).expect("append");
            wal.wait().expect("wait");
        }
    }

    /// Appends until the log writes into another segment; returns it.
    fn append_until_roll(wal: &mut Wal) -> u64 {
        let before = wal.active;
        while wal.active == before {
            append_durably(wal, 1);
        }
        wal.active
    }

    /// A spare prepared in the background while a trim recycles files
    /// under higher numbers must not be written after them: recovery
    /// reads segments by number and would put newer batches first (a
    /// crash test recovered an empty log this way).
    #[test]
    fn a_spare_prepared_during_a_trim_is_written_in_number_order() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        while wal.active < 4 {
            append_until_roll(&mut wal);
        }
        // No spare ready; one being prepared, held until released.
        wal.collect_spare(true).unwrap();
        for id in std::mem::take(&mut wal.ready_spares) {
            fs::remove_file(segment_path(dir.path(), id)).unwrap();
        }
        wal.recycled_spares.clear();
        let slow = wal.highest_segment_id() + 1;
        let (release, hold) = mpsc::channel::<()>();
        let (path, bytes) = (dir.path().to_path_buf(), wal.cfg.segment_bytes);
        let job = std::thread::spawn(move || {
            let _ = hold.recv();
            preallocate(&path, slow, bytes)
        });
        wal.spare = Some((slow, job));
        // The trim recycles the segments below the snapshot past `slow`.
        let snap = Snapshot {
            index: wal.durable().0,
            term: 1,
            membership: Membership::with_voters([1]),
            data: Vec::new(),
        };
        wal.compact(&snap).unwrap();
        assert!(wal.ready_spares.first().is_some_and(|&id| id > slow));
        let mut written = vec![wal.active, append_until_roll(&mut wal)];
        assert!(written[1] > slow, "the roll took a recycled spare first");
        release.send(()).unwrap();
        wal.collect_spare(true).unwrap();
        for _ in 0..3 {
            written.push(append_until_roll(&mut wal));
        }
        assert!(
            written.windows(2).all(|w| w[0] < w[1]),
            "segments written out of number order: {written:?}"
        );
        let last = wal.last().0;
        drop(wal);
        let (_, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert!(
            report.torn_tail.is_none() && report.corruption.is_empty(),
            "{report}"
        );
        assert_eq!(report.restored.entries.last().map(|e| e.index), Some(last));
        assert_eq!(
            report.restored.entries.first().map(|e| e.index),
            Some(snap.index + 1)
        );
    }
}
