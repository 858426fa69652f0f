//! Reads by index: the batch index (where each batch of the log lives), the
//! read cache, cold reads on the ring ([`Wal::cached`]: the loop's way, it
//! never waits), blocking reads for tools and tests ([`Wal::read`]), and
//! reads on other threads from located batches.

use super::*;
use crate::consensus::{Entry, Index};
use crate::io::{AlignedBuf, IoCompletion, IoOp, IoRequest};
use crate::storage::format::{align_up, decode_batch, BLOCK_BYTES};
use crate::storage::recovery::BatchLocation;

impl<D: LogDir> Wal<D> {
    /// Keeps the index in log order: a batch replaces everything from its
    /// first index on.
    pub(super) fn note_batch_location(&mut self, l: BatchLocation) {
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
}

impl<D: LogDir> Wal<D> {
    /// The batch holding entry `index`, if the log has it.
    pub(super) fn batch_at(&self, index: Index) -> Option<BatchLocation> {
        let pos = self.index.partition_point(|b| b.first_index <= index);
        let loc = self.index[pos.checked_sub(1)?];
        (index < loc.first_index + loc.count).then_some(loc)
    }

    pub(super) fn batch_at_or_err(&self, index: Index) -> Result<BatchLocation, WalError> {
        self.batch_at(index)
            .ok_or_else(|| WalError::Invalid(format!("index {index} is not in the log")))
    }

    /// True if the log holds entry `index` in a batch it can read, or a
    /// repaired copy of it.
    pub fn holds(&self, index: Index) -> bool {
        self.batch_at(index).is_some() || self.repaired.get(index).is_some()
    }

    /// Where the durable entries `lo..=hi` are: each batch's segment file
    /// and place, for [`read_located`] to read them on another thread.
    pub fn locate(&self, lo: Index, hi: Index) -> Result<Vec<(String, BatchLocation)>, WalError> {
        if hi > self.durable.0 {
            return Err(WalError::Invalid(format!("index {hi} is not durable")));
        }
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            let loc = self.batch_at_or_err(i)?;
            out.push((segment_name(loc.segment), loc));
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    /// Like [`Wal::locate`], for a range below the snapshot where some
    /// entries are repaired copies (`Wal::store_repaired`) rather than in
    /// a segment's batch: the batches to read, and the repaired copies
    /// (shared, not copied) to merge with what they hold.
    pub fn locate_with_repaired(&self, lo: Index, hi: Index) -> Result<LocatedRange, WalError> {
        self.locate_with_repaired_bytes(lo, hi, u64::MAX)
    }

    /// [`Wal::locate_with_repaired`], stopping once the entries located
    /// hold at least `bytes_max` bytes (at least one entry is located),
    /// or the batches four times that on disk: a batch's padding (up to a
    /// block) counts for nothing, so small batches do not make a chunk of
    /// one entry each.
    pub fn locate_with_repaired_bytes(
        &self,
        lo: Index,
        hi: Index,
        bytes_max: u64,
    ) -> Result<LocatedRange, WalError> {
        if hi > self.durable.0 {
            return Err(WalError::Invalid(format!("index {hi} is not durable")));
        }
        let mut out = LocatedRange::default();
        let mut i = lo;
        let (mut bytes, mut disk_bytes) = (0u64, 0u64);
        while i <= hi && bytes < bytes_max && disk_bytes < bytes_max.saturating_mul(4) {
            if let Some(loc) = self.batch_at(i) {
                out.batches.push((segment_name(loc.segment), loc));
                i = loc.first_index + loc.count;
                bytes += loc.disk_bytes.saturating_sub(BLOCK_BYTES as u64);
                disk_bytes += loc.disk_bytes;
            } else if let Some(e) = self.repaired.get(i) {
                bytes += e.size_bytes() as u64 + 32;
                out.repaired.push(e.clone());
                i += 1;
            } else {
                return Err(WalError::Invalid(format!("index {i} is not in the log")));
            }
        }
        Ok(out)
    }

    /// The indexes in `lo..hi` the log holds in no batch and no repaired
    /// copy (at most `max` of them, ascending): what damage below the
    /// snapshot took besides the entries the state refers to.
    pub fn gaps(&self, lo: Index, hi: Index, max: usize) -> Vec<Index> {
        let mut out = Vec::new();
        let mut i = lo;
        while i < hi && out.len() < max {
            match self.batch_at(i) {
                Some(loc) => i = loc.first_index + loc.count,
                None => {
                    if self.repaired.get(i).is_none() {
                        out.push(i);
                    }
                    i += 1;
                }
            }
        }
        out
    }

    /// The durable batches from the one holding `from` on, in index
    /// order, until `bytes_max` bytes on disk (at least one): what a scrub
    /// reads next. Empty past the last durable batch. (A durable index is
    /// not enough: a rewrite of the log's end after a truncation sits in
    /// the index before it is durable, at indexes durable in their old
    /// version; batches are durable in sequence order.) Locations only:
    /// the reader names their files on its own thread.
    pub fn batches_from(&self, from: Index, bytes_max: u64) -> Vec<BatchLocation> {
        let start = self
            .index
            .partition_point(|b| b.first_index + b.count <= from);
        let mut out = Vec::new();
        let mut bytes = 0;
        for loc in &self.index[start..] {
            if loc.seq > self.durable_seq || (!out.is_empty() && bytes + loc.disk_bytes > bytes_max)
            {
                break;
            }
            bytes += loc.disk_bytes;
            out.push(*loc);
        }
        out
    }

    /// True if the log still reads entries from `loc` (a scrub's finding
    /// about a batch trimmed meanwhile is stale).
    pub fn still_indexed(&self, loc: &BatchLocation) -> bool {
        self.batch_at(loc.first_index) == Some(*loc)
    }

    /// Stops reading from `loc`, a batch below the snapshot a scrub found
    /// damaged: its entries read as missing until repaired copies stand in
    /// for them (`store_repaired`). A batch holding the live log is left
    /// to recovery, which repairs it from the leader (Raft holds those
    /// entries in memory meanwhile).
    pub fn distrust_batch(&mut self, loc: &BatchLocation) -> bool {
        let below = loc.first_index + loc.count.max(1) - 1 <= self.snapshot_index;
        if !below || !self.still_indexed(loc) {
            return false;
        }
        self.index.retain(|b| b != loc);
        if self.cache.remove(&loc.seq).is_some() {
            let cache = &self.cache;
            self.cache_order.retain(|seq| cache.contains_key(seq));
        }
        true
    }

    /// The directory the log is in (a reader on another thread opens the
    /// files [`Wal::locate`] names in a clone of it).
    pub fn dir(&self) -> &D {
        &self.dir
    }

    /// Entries `lo..=hi` that are durable, read from the segments through
    /// the backend (with the read cache), waiting for each read: for
    /// tools, tests and the simulator's checks, never the node's loop
    /// (which uses [`Wal::cached`]).
    pub fn read(&mut self, lo: Index, hi: Index) -> Result<Vec<Entry>, WalError> {
        let hi = hi.min(self.durable.0);
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            // A repaired copy serves in place of the log's (which may be
            // the damaged one).
            if let Some(e) = self.repaired.get(i) {
                out.push(e.clone());
                i += 1;
                continue;
            }
            let loc = self.batch_at_or_err(i)?;
            let end = (loc.first_index + loc.count).min(hi + 1);
            // The batch is read only for what is not repaired.
            let from_batch = match (i..end).all(|j| self.repaired.get(j).is_some()) {
                true => Vec::new(),
                false => self.read_batch(loc)?,
            };
            for j in i..end {
                match self.repaired.get(j) {
                    Some(e) => out.push(e.clone()),
                    None => out.push(from_batch[(j - loc.first_index) as usize].clone()),
                }
            }
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    /// The durable entry `index` if the read cache has its batch; else
    /// starts reading the batch on the ring (a cold read) and says
    /// [`CachedRead::Reading`]: ask again once [`Wal::cold_reads_done`]
    /// moves. Never waits. A cold read that failed is reported once, as
    /// an error for whoever asks next; a batch that does not decode or
    /// comes back short (a damaged or replaced segment) does not stop the
    /// log, an I/O error of the kernel's does (as a failed flush does).
    /// At most [`COLD_READS_IN_FLIGHT_MAX`] are in
    /// flight: past that it is `Reading` without a read started, and a
    /// later call starts it.
    pub fn cached(&mut self, index: Index) -> Result<CachedRead, WalError> {
        if index > self.durable.0 {
            return Err(WalError::Invalid(format!("index {index} is not durable")));
        }
        if let Some(e) = self.repaired.get(index) {
            return Ok(CachedRead::Entry(e.clone()));
        }
        let loc = self.batch_at_or_err(index)?;
        if let Some(e) = self.cached_entry(loc, index) {
            return Ok(CachedRead::Entry(e));
        }
        if let Some(p) = self.cold_read_failures.iter().position(|(l, _)| *l == loc) {
            let (_, why) = self.cold_read_failures.remove(p).expect("just found");
            return Err(match self.state {
                DiskState::Failed(_) => WalError::Stopped(why),
                _ => WalError::Corrupt(why),
            });
        }
        if self.cold_reads.values().any(|l| *l == loc)
            || self.cold_reads.len() >= COLD_READS_IN_FLIGHT_MAX
        {
            return Ok(CachedRead::Reading);
        }
        self.check_not_failed()?;
        let fd = self
            .segments
            .get(&loc.segment)
            .ok_or_else(|| WalError::Invalid(format!("segment {} is not open", loc.segment)))?
            .fd();
        let token = self.next_read_token;
        let op = IoOp::Read {
            fd,
            offset: loc.offset,
            len: align_up(loc.disk_bytes as usize),
        };
        self.backend
            .submit(IoRequest {
                token,
                ops: vec![op],
            })
            .map_err(io_err("submitting a cold read"))?;
        self.next_read_token += 1;
        self.cold_reads.insert(token, loc);
        Ok(CachedRead::Reading)
    }

    /// Cold reads finished so far (done or failed): a caller parked on
    /// [`CachedRead::Reading`] asks again when this moves.
    pub fn cold_reads_done(&self) -> u64 {
        self.metrics.cold_reads + self.metrics.cold_read_errors
    }

    /// Cold reads in flight.
    pub fn cold_reads_in_flight(&self) -> usize {
        self.cold_reads.len()
    }

    /// Runs a request and waits for it, handling other completions.
    pub(super) fn run_now(&mut self, ops: Vec<IoOp>) -> Result<Vec<AlignedBuf>, WalError> {
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
                if let Some(c) = self.note_done(c) {
                    mine = mine.or((c.token == TOKEN).then_some(c));
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

    /// Handles a completed flush or cold read; gives back any other
    /// completion (`run_now`'s).
    pub(super) fn note_done(&mut self, c: IoCompletion) -> Option<IoCompletion> {
        let c = self.note_flush_done(c)?;
        let Some(loc) = self.cold_reads.remove(&c.token) else {
            return Some(c);
        };
        let read = match c.result {
            Ok(()) => c
                .bufs
                .first()
                .ok_or_else(|| "the read brought no buffer back".to_string())
                .and_then(|b| batch_entries(loc, b.as_slice()).map_err(|e| e.to_string())),
            Err(e) => {
                let why = format!(
                    "reading segment {} at offset {}: {e}",
                    loc.segment, loc.offset
                );
                // An error of the kernel's (EIO): the disk failed, not one
                // batch. The log stops, as after a failed flush, so that
                // the group moves to a replica whose disk reads (a leader
                // left leading would fail the same read on every retry of
                // its clients). A short read is a damaged file: that
                // request's error only.
                if e.raw_os_error().is_some() {
                    self.metrics.io_errors += 1;
                    if !matches!(self.state, DiskState::Failed(_)) {
                        self.state = DiskState::Failed(why.clone());
                    }
                }
                Err(why)
            }
        };
        match read {
            Ok(entries) => {
                self.metrics.cold_reads += 1;
                // Only if the log still holds that batch (a truncation or
                // an installed snapshot may have replaced it meanwhile).
                if self.batch_at(loc.first_index) == Some(loc) {
                    self.cache_batch(loc, entries.clone());
                }
            }
            Err(why) => {
                self.metrics.cold_read_errors += 1;
                if self.cold_read_failures.len() >= COLD_READ_FAILURES_MAX {
                    self.cold_read_failures.pop_front();
                }
                self.cold_read_failures.push_back((loc, why));
            }
        }
        if self.cold_reads.is_empty() {
            self.retired_files.clear();
        }
        None
    }

    /// Drops segment `id` from the open files; kept open while cold reads
    /// are in flight, as one of them may name it.
    pub(super) fn retire_segment(&mut self, id: u64) {
        if let Some(f) = self.segments.remove(&id) {
            if !self.cold_reads.is_empty() {
                self.retired_files.push(f);
            }
        }
    }

    /// Entry `index` of batch `loc`, if the cache holds that batch.
    fn cached_entry(&self, loc: BatchLocation, index: Index) -> Option<Entry> {
        let (l, entries) = self.cache.get(&loc.seq)?;
        if *l != loc {
            return None;
        }
        entries.get((index - loc.first_index) as usize).cloned()
    }

    /// Keeps a batch read back, evicting the oldest past `read_cache_bytes`
    /// (the newest stays even if larger).
    fn cache_batch(&mut self, loc: BatchLocation, entries: Vec<Entry>) {
        if let Some((old, _)) = self.cache.insert(loc.seq, (loc, entries)) {
            self.cache_bytes -= old.disk_bytes as usize;
        } else {
            self.cache_order.push_back(loc.seq);
        }
        self.cache_bytes += loc.disk_bytes as usize;
        while self.cache_bytes > self.cfg.read_cache_bytes && self.cache_order.len() > 1 {
            let oldest = self.cache_order.pop_front().expect("more than one");
            if let Some((l, _)) = self.cache.remove(&oldest) {
                self.cache_bytes -= l.disk_bytes as usize;
            }
        }
    }

    /// Drops cached batches holding entries from `first_index` on (they
    /// were replaced).
    pub(super) fn uncache_from(&mut self, first_index: Index) {
        let cache_bytes = &mut self.cache_bytes;
        self.cache.retain(|_, (loc, _)| {
            let keep = loc.first_index + loc.count <= first_index;
            if !keep {
                *cache_bytes -= loc.disk_bytes as usize;
            }
            keep
        });
        let cache = &self.cache;
        self.cache_order.retain(|seq| cache.contains_key(seq));
    }

    pub(super) fn read_batch(&mut self, loc: BatchLocation) -> Result<Vec<Entry>, WalError> {
        if let Some((l, e)) = self.cache.get(&loc.seq) {
            if *l == loc {
                return Ok(e.clone());
            }
        }
        let fd = self.segments[&loc.segment].fd();
        let len = align_up(loc.disk_bytes as usize);
        let bufs = self.run_now(vec![IoOp::Read {
            fd,
            offset: loc.offset,
            len,
        }])?;
        let entries = batch_entries(loc, bufs[0].as_slice())?;
        self.cache_batch(loc, entries.clone());
        Ok(entries)
    }
}

/// The first token of a cold read: flush tickets count up from 1 and
/// `run_now` uses `u64::MAX`, so neither meets these.
pub(super) const READ_TOKEN_FIRST: u64 = 1 << 62;

/// Cold reads in flight at once, per log.
pub const COLD_READS_IN_FLIGHT_MAX: usize = 32;

/// Failed cold reads kept until someone asks for them again.
const COLD_READ_FAILURES_MAX: usize = 64;

/// What [`Wal::cached`] has for an entry.
#[derive(Debug)]
pub enum CachedRead {
    /// The entry, from the read cache.
    Entry(Entry),
    /// Its batch is being read; ask again when a cold read is done.
    Reading,
}

/// The entries of batch `loc`, decoded from `bytes` read at its place: a
/// place that no longer holds that batch (its segment was trimmed and
/// reused) is an error, never other entries.
fn batch_entries(loc: BatchLocation, bytes: &[u8]) -> Result<Vec<Entry>, WalError> {
    let moved = |why: String| {
        WalError::Corrupt(format!(
            "segment {} offset {}: {why} (reading entries from {})",
            loc.segment, loc.offset, loc.first_index
        ))
    };
    let batch = decode_batch(bytes).map_err(|e| moved(e.to_string()))?;
    if (batch.seq, batch.first_index, batch.place.segment)
        != (loc.seq, loc.first_index, loc.segment)
    {
        return Err(moved("it no longer holds that batch".into()));
    }
    let mut entries = batch.entries;
    entries.truncate(loc.count as usize);
    Ok(entries)
}

/// What one scrub read found: bytes read, batches that checked out, and
/// the batches that did not, each with why.
#[derive(Debug, Default)]
pub struct ScrubResult {
    /// Bytes read.
    pub bytes: u64,
    /// Batches whose records and checksums were whole.
    pub good_batches: u64,
    /// Batches that failed, and why.
    pub damaged: Vec<(BatchLocation, String)>,
}

/// Reads the batches `located` from `dir` and checks each whole (every
/// record's checksum, and that it is the batch that was located), on any
/// thread: a scrub's read. A file that cannot be opened or read counts
/// against each of its batches.
pub fn scrub_located<D: LogDir>(dir: &D, located: &[BatchLocation]) -> ScrubResult {
    let mut r = ScrubResult::default();
    let mut reader = BatchReader::new(dir);
    for loc in located {
        r.bytes += loc.disk_bytes;
        match reader.read(&segment_name(loc.segment), loc) {
            Ok(_) => r.good_batches += 1,
            Err(e) => r.damaged.push((*loc, e.to_string())),
        }
    }
    r
}

/// Entries below the snapshot located for reading on another thread:
/// batches in segments, and repaired copies held in memory.
#[derive(Debug, Default)]
pub struct LocatedRange {
    /// Batches to read (`read_located`).
    pub batches: Vec<(String, BatchLocation)>,
    /// Repaired copies, ascending.
    pub repaired: Vec<Entry>,
}

impl LocatedRange {
    /// Reads the batches from `dir` and merges in the repaired copies:
    /// the entries `lo..=hi`, ascending.
    pub fn read<D: LogDir>(&self, dir: &D, lo: Index, hi: Index) -> Result<Vec<Entry>, WalError> {
        let mut out = read_located(dir, &self.batches, lo, hi)?;
        out.extend(
            self.repaired
                .iter()
                .filter(|e| (lo..=hi).contains(&e.index))
                .cloned(),
        );
        // Two ascending runs: the sort merges them in one pass.
        out.sort_by_key(|e| e.index);
        Ok(out)
    }
}

/// Reads the entries `lo..=hi` from the batches [`Wal::locate`] named in
/// `dir` (the log's, or a clone of it), with plain reads, on any thread.
/// A batch that no longer holds what was located (its segment was trimmed
/// and reused meanwhile) is an error, never other entries.
pub fn read_located<D: LogDir>(
    dir: &D,
    located: &[(String, BatchLocation)],
    lo: Index,
    hi: Index,
) -> Result<Vec<Entry>, WalError> {
    let mut out = Vec::new();
    let mut reader = BatchReader::new(dir);
    for (name, loc) in located {
        let entries = reader.read(name, loc)?;
        out.extend(
            entries
                .into_iter()
                .filter(|e| e.index >= lo && e.index <= hi),
        );
    }
    Ok(out)
}

/// Reads located batches from a directory with plain reads, keeping the
/// last file opened (batches come in file order).
struct BatchReader<'a, D: LogDir> {
    dir: &'a D,
    open: Option<(String, D::File)>,
}

impl<'a, D: LogDir> BatchReader<'a, D> {
    fn new(dir: &'a D) -> Self {
        BatchReader { dir, open: None }
    }

    /// The entries of the batch at `loc` in file `name`, checked whole.
    fn read(&mut self, name: &str, loc: &BatchLocation) -> Result<Vec<Entry>, WalError> {
        let dir = self.dir;
        if self.open.as_ref().is_none_or(|(n, _)| n != name) {
            self.open = None;
            let f = dir
                .open_existing(name)
                .map_err(io_err(format!("opening {name} in {}", dir.describe())))?;
            self.open = Some((name.to_string(), f));
        }
        let (_, f) = self.open.as_ref().expect("just opened");
        let mut buf = vec![0u8; loc.disk_bytes as usize];
        f.read_at(&mut buf, loc.offset)
            .map_err(io_err(format!("reading {name} in {}", dir.describe())))?;
        batch_entries(*loc, &buf)
    }
}

#[cfg(test)]
mod tests;
