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
//!
//! The parts: [`config`] (configuration, errors, metrics), [`open`]
//! (recovery at open), [`commit`] (group commit), [`segments`] (roll,
//! spares, recycling, trim), [`snapshots`] (slot files, compaction,
//! install, adoption), [`reads`] (batch index, read cache) and
//! [`repaired`] (entries below the snapshot repaired from a peer).

mod adopt;
mod commit;
mod config;
mod open;
mod reads;
mod repaired;
mod segments;
mod snapshots;
mod staged;
mod worker;

#[cfg(test)]
mod test_support;

pub use config::{
    entry_bytes_max, segments_recycled_for, DiskState, OpenReport, WalConfig, WalError, WalMetrics,
};
pub use reads::{
    read_located, scrub_located, CachedRead, LocatedRange, ScrubResult, COLD_READS_IN_FLIGHT_MAX,
};
pub use repaired::REPAIRED_BYTES_MAX;
pub(crate) use snapshots::write_snapshot_synced_or_not;
pub use snapshots::{write_snapshot_file, write_snapshot_in};
pub use staged::{
    discard_staged, drop_staged, remove_dropped, StagedHead, StagedImage, STAGED_META_BYTES_MAX,
};

use crate::consensus::{Entry, HardState, Index, Term};
use crate::io::{AlignedBuf, IoBackend};
use crate::storage::dir::{LogDir, LogFile, OsDir};
use crate::storage::recovery::BatchLocation;
use crate::storage::superblock::Superblock;
use commit::{InFlight, Sealed};
use config::io_err;
use config::is_enospc;
use segments::{open_in, segment_name};
use snapshots::PendingAdoption;
use snapshots::{read_snapshot, snapshot_name};
use std::collections::{BTreeMap, VecDeque};
use worker::{preallocate, Job, JobId, Worker};

/// Identifies a flush; see the module doc.
pub type Ticket = u64;

/// The write-ahead log of one group, in a directory `D` (a real one, or a
/// simulated device's).
pub struct Wal<D: LogDir = OsDir> {
    dir: D,
    cfg: WalConfig,
    backend: Box<dyn IoBackend>,
    direct: bool,
    _lock: D::File,
    sb_file: D::File,
    sb: Superblock,
    sb_dirty: bool,
    segments: BTreeMap<u64, D::File>,
    active: u64,
    append_offset: u64,
    /// The segment being preallocated in the background, if any.
    spare: Option<(u64, JobId)>,
    /// Preallocated segments after the active one, ready to use.
    ready_spares: std::collections::BTreeSet<u64>,
    /// Spares that are recycled files (they may hold old batches).
    recycled_spares: std::collections::BTreeSet<u64>,
    /// The directory fsync after a trim, run on a thread of its own: it
    /// must be done before a recycled spare is written (its new name must
    /// be durable), not before the loop goes on.
    dir_sync: Option<JobId>,
    /// The thread that zero-fills spares, syncs the directory and unlinks.
    worker: Worker<D>,
    /// A snapshot the superblock records in a flush not yet durable: the
    /// segments it frees and the old snapshot file go once it is.
    adopting: Option<PendingAdoption>,
    /// The slot file holding the superblock's snapshot (`None`: none, or
    /// a file from before slots); the other one takes the next snapshot.
    snapshot_slot: Option<u8>,
    /// The active segment is a recycled file.
    active_recycled: bool,
    next_seq: u64,
    /// The sequence number of the last batch durable (flushes are durable
    /// in order): a batch above it is in the index but may not be on disk.
    durable_seq: u64,
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
    /// The read cache: batches read back from the segments, by sequence
    /// number, and the order they came in (the oldest is evicted first).
    cache: BTreeMap<u64, (BatchLocation, Vec<Entry>)>,
    cache_order: VecDeque<u64>,
    cache_bytes: usize,
    /// Cold reads on the ring, by token (at most
    /// [`COLD_READS_IN_FLIGHT_MAX`]), and the next token.
    cold_reads: BTreeMap<u64, BatchLocation>,
    next_read_token: u64,
    /// Cold reads that failed, until [`Wal::cached`] reports each once
    /// (at most [`COLD_READ_FAILURES_MAX`]).
    cold_read_failures: VecDeque<(BatchLocation, String)>,
    /// Segment files trimmed or replaced while cold reads were in flight:
    /// a read names its file by descriptor, so the file stays open until
    /// no read is in flight.
    retired_files: Vec<D::File>,
    /// Entries at or below the snapshot repaired from a peer
    /// ([`Wal::store_repaired`]), which serve in place of the log's copies.
    repaired: repaired::Repaired,
    /// Batch buffers back from the kernel, reused for the next batches.
    buf_pool: Vec<AlignedBuf>,
    state: DiskState,
    /// When preparing a segment last failed for want of space (µs).
    last_space_retry: Option<u64>,
    metrics: WalMetrics,
}

impl<D: LogDir> Wal<D> {
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
}
