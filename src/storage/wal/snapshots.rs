//! Snapshots: the two slot files, compaction, installing a leader's snapshot,
//! and adopting one written on another thread.

use super::*;
use crate::consensus::{Entry, Index, Snapshot, Term};
use crate::storage::dir::{LogDir, LogFile, OsDir};
use crate::storage::superblock::{
    decode_snapshot, snapshot_header, snapshot_header_index, snapshot_total_bytes,
    SNAPSHOT_HEADER_BYTES_MAX,
};
use std::io;
use std::path::{Path, PathBuf};

/// The file name of a snapshot from before slots (read, never written).
pub(super) fn snapshot_name(index: Index) -> String {
    format!("snapshot-{index:020}.bin")
}

/// Bytes of a snapshot file written back at a time.
pub(super) const SNAPSHOT_WRITEBACK_BYTES: usize = 1 << 20;

/// The file name of snapshot slot `slot` (0 or 1).
pub(super) fn slot_name(slot: u8) -> String {
    format!("snapshot.{slot}")
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
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(WalError::Invalid(format!(
            "{} is not a file in a log directory",
            path.display()
        )));
    };
    write_snapshot_in(&OsDir::new(dir), &name.to_string_lossy(), snap)
}

/// [`write_snapshot_file`] into slot file `name` of any [`LogDir`].
pub fn write_snapshot_in<D: LogDir>(dir: &D, name: &str, snap: &Snapshot) -> Result<(), WalError> {
    write_snapshot_synced_or_not(dir, name, snap, true)
}

/// [`write_snapshot_in`]; without `synced` (a bug the simulator plants,
/// never the daemon) the file is written but not made durable.
pub(crate) fn write_snapshot_synced_or_not<D: LogDir>(
    dir: &D,
    name: &str,
    snap: &Snapshot,
    synced: bool,
) -> Result<(), WalError> {
    let write = || -> io::Result<()> {
        let header = snapshot_header(snap);
        let total = (header.len() + snap.data.len() + 4) as u64;
        let (f, _, _) = dir.open(name, false)?;
        let size = f.size_bytes()?;
        if size < total {
            let grown = (total * 2).max(1 << 20).next_multiple_of(1 << 20);
            let zeros = vec![0u8; 1 << 20];
            let mut at = size;
            while at < grown {
                let n = (grown - at).min(zeros.len() as u64) as usize;
                f.write_at(&zeros[..n], at)?;
                at += n as u64;
            }
            if synced {
                f.sync_all()?;
                dir.sync()?;
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
            f.write_at(piece, at)?;
            f.write_back(at, piece.len() as u64)?;
            at += piece.len() as u64;
        }
        if synced {
            f.sync_data()?;
        }
        Ok(())
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
pub(super) fn read_snapshot<D: LogDir>(
    dir: &D,
    index: Index,
) -> Result<Option<(Snapshot, Option<u8>)>, WalError> {
    let read = |name: &str| match dir.read(name) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WalError::Io(
            format!("reading {}/{name}", dir.describe()),
            e,
        )),
    };
    for slot in 0..2u8 {
        // A slot is grown to twice what it holds: read its header, then
        // only the snapshot it names, not the whole slot.
        let name = slot_name(slot);
        let file = match dir.open_existing(&name) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(WalError::Io(
                    format!("opening {}/{name}", dir.describe()),
                    e,
                ))
            }
        };
        let reading = |e| WalError::Io(format!("reading {}/{name}", dir.describe()), e);
        let size = file.size_bytes().map_err(reading)?;
        let mut head = vec![0u8; (SNAPSHOT_HEADER_BYTES_MAX as u64).min(size) as usize];
        file.read_at(&mut head, 0).map_err(reading)?;
        if snapshot_header_index(&head) != Some(index) {
            continue;
        }
        let Some(total) = snapshot_total_bytes(&head).filter(|&t| t <= size) else {
            continue;
        };
        let mut bytes = vec![0u8; total as usize];
        file.read_at(&mut bytes, 0).map_err(reading)?;
        if let Some(s) = decode_snapshot(&bytes).filter(|s| s.index == index) {
            return Ok(Some((s, Some(slot))));
        }
    }
    Ok(read(&snapshot_name(index))?
        .and_then(|bytes| decode_snapshot(&bytes))
        .map(|s| (s, None)))
}

/// See `Wal::adopt_snapshot`.
pub(super) struct PendingAdoption {
    /// Durable once this ticket is.
    pub(super) ticket: Ticket,
    /// Segments wholly at or below this index go then.
    pub(super) upto: Index,
    /// The superblock's snapshot file from before slots (it goes then).
    pub(super) old_file: Option<String>,
}

impl<D: LogDir> Wal<D> {
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
    /// fresh segment, durable before the snapshot is recorded; the
    /// superblock names that segment as an unfinished install until then,
    /// so a crash in between leaves the old snapshot and log in force.
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
        let old = self.clear_for_install();
        // Past every existing file, spares preallocated earlier included.
        let next = old.last().map_or(self.active, |&m| m.max(self.active)) + 1;
        if !below.is_empty() {
            // The kept entries read as a rewrite of the log from the first
            // of them: until the snapshot is recorded, a crash must not
            // find them, or it would cut off the old log (entries this node
            // acknowledged). Recovery removes the segment the superblock
            // names here and every later one (the kept entries may fill
            // several); recording the snapshot clears it.
            self.sb.install_segment = next;
            self.write_superblock_now()?;
        }
        self.commit = self.commit.max(snap.index);
        preallocate(&self.dir, next, self.cfg.segment_bytes).map_err(|e| {
            if is_enospc(&e) {
                WalError::DiskFull
            } else {
                WalError::Io("preallocating a segment".into(), e)
            }
        })?;
        let (f, _, _) = self.open_file(&segment_name(next), self.direct)?;
        self.segments.insert(next, f);
        self.active = next;
        self.active_recycled = false;
        self.append_offset = 0;
        self.index.clear();
        self.uncache_from(0);
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
        self.finish_install(snap, old, segment_name)
    }

    /// Before an install: drops the spares (a fresh segment, or staged
    /// ones, start the new log) and returns the old segments.
    pub(super) fn clear_for_install(&mut self) -> Vec<u64> {
        if let Some((id, job)) = self.spare.take() {
            let _ = self.worker.wait(job);
            let _ = self.dir.remove(&segment_name(id));
        }
        for id in std::mem::take(&mut self.ready_spares) {
            let _ = self.dir.remove(&segment_name(id));
        }
        self.recycled_spares.clear();
        self.segments.keys().copied().collect()
    }

    /// The end of an install, its new segments durable: records the
    /// snapshot, then removes the `old` segments.
    pub(super) fn finish_install(
        &mut self,
        snap: &Snapshot,
        old: Vec<u64>,
        name: fn(u64) -> String,
    ) -> Result<(), WalError> {
        self.store_snapshot(snap)?;
        // Only now, with the snapshot recorded: a crash before it leaves
        // the old snapshot in force, which needs its repaired copies.
        self.forget_repaired_upto(Index::MAX)?;
        for id in old {
            self.retire_segment(id);
            self.dir
                .remove(&name(id))
                .map_err(io_err("removing a segment"))?;
        }
        self.dir
            .sync()
            .map_err(io_err("syncing the log directory"))?;
        self.last = (snap.index, snap.term);
        self.note_durable(self.last);
        Ok(())
    }

    pub(super) fn store_snapshot(&mut self, snap: &Snapshot) -> Result<(), WalError> {
        write_snapshot_in(&self.dir, &self.free_slot_name(), snap)?;
        self.record_snapshot(snap.index, snap.term)
    }

    /// The slot file the next snapshot is written to: the one the
    /// superblock does not name. One writer at a time: the caller writes
    /// it, then adopts what it wrote, before another snapshot (or an
    /// install) is written.
    pub fn free_slot_name(&self) -> String {
        slot_name(self.snapshot_slot.map_or(0, |s| 1 - s))
    }

    /// Points the log at the free slot's snapshot; a file from before
    /// slots that the superblock named goes once it no longer does.
    pub(super) fn take_free_slot(&mut self) -> Option<String> {
        let legacy = (self.snapshot_slot.is_none() && self.snapshot_index > 0)
            .then(|| snapshot_name(self.snapshot_index));
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
        // The snapshot's state may refer to entries up to `index`: naming it
        // before they are durable would lose them in a crash.
        assert!(
            self.durable.0 >= index,
            "adopting a snapshot at {index} with the log durable to {}",
            self.durable.0
        );
        let old_file = self.take_free_slot();
        self.sb.snapshot_index = index;
        self.sb.snapshot_term = term;
        // An install's fresh segment is the log from here on.
        self.sb.install_segment = 0;
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
    pub(super) fn finish_adoption(&mut self) -> Result<(), WalError> {
        let Some(p) = &self.adopting else {
            return Ok(());
        };
        if self.durable_ticket < p.ticket {
            return Ok(());
        }
        let p = self.adopting.take().expect("checked above");
        if let Some(old) = p.old_file {
            self.worker.submit(Job::Unlink(old));
        }
        self.trim_segments(p.upto)
    }

    /// Names the snapshot just written to the free slot in the
    /// superblock, durably, now.
    pub(super) fn record_snapshot(&mut self, index: Index, term: Term) -> Result<(), WalError> {
        let old_file = self.take_free_slot();
        self.sb.snapshot_index = index;
        self.sb.snapshot_term = term;
        // An install's fresh segment is the log from here on.
        self.sb.install_segment = 0;
        self.snapshot_index = index;
        self.write_superblock_now()?;
        if let Some(old) = old_file {
            self.worker.submit(Job::Unlink(old));
        }
        Ok(())
    }
}

impl Wal<OsDir> {
    /// The path of [`Wal::free_slot_name`], for a writer on another
    /// thread ([`write_snapshot_file`]).
    pub fn free_snapshot_slot(&self) -> PathBuf {
        self.dir.root().join(self.free_slot_name())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_durably, indexes, small_cfg, snapshot};
    use super::*;
    use crate::storage::format::BLOCK_BYTES;

    #[test]
    fn snapshots_take_the_two_slots_in_turn_and_the_newest_recorded_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 30);
        let first_slot = wal.free_snapshot_slot();
        wal.compact(&snapshot(10)).unwrap();
        let second_slot = wal.free_snapshot_slot();
        assert_ne!(first_slot, second_slot);
        wal.compact(&snapshot(20)).unwrap();
        assert_eq!(wal.free_snapshot_slot(), first_slot);
        // Written into the free slot but never adopted: not the log's.
        write_snapshot_file(&wal.free_snapshot_slot(), &snapshot(25)).unwrap();
        drop(wal);
        let (_, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(report.restored.snapshot.map(|s| s.index), Some(20));
        assert_eq!(report.restored.entries.first().map(|e| e.index), Some(21));
        assert_eq!(report.restored.entries.last().map(|e| e.index), Some(30));
    }

    #[test]
    fn an_adoption_is_recorded_with_the_next_flush_and_trims_once_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 40);
        let segments_before = wal.segments.len();
        write_snapshot_file(&wal.free_snapshot_slot(), &snapshot(35)).unwrap();
        wal.adopt_snapshot(35, 1, None).unwrap();
        assert!(wal.adopting.is_some(), "waits for the superblock's flush");
        wal.sync().unwrap();
        assert!(wal.adopting.is_none());
        assert!(
            wal.segments.len() < segments_before,
            "segments below 35 trimmed"
        );
        drop(wal);
        let (_, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(report.restored.snapshot.map(|s| s.index), Some(35));
        assert_eq!(report.restored.entries.last().map(|e| e.index), Some(40));
    }

    #[test]
    fn an_installed_snapshot_replaces_the_log_keeping_the_entries_it_needs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 10);
        let below: Vec<Entry> = (98..=100).map(super::super::test_support::entry).collect();
        wal.install_snapshot(&snapshot(100), &below).unwrap();
        assert_eq!(wal.last().0, 100);
        assert!(!wal.holds(5));
        let gap = [
            super::super::test_support::entry(7),
            super::super::test_support::entry(9),
        ];
        let err = wal
            .install_snapshot(&snapshot(200), &gap)
            .expect_err("refused");
        assert!(matches!(err, WalError::Invalid(_)), "{err}");
        append_durably(&mut wal, 2);
        drop(wal);
        let (wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(report.restored.snapshot.map(|s| s.index), Some(100));
        assert_eq!(indexes(&report.restored.entries), [101, 102]);
        assert!(
            (98..=102).all(|i| wal.holds(i)),
            "the entries kept below the snapshot are still readable"
        );
    }
    #[test]
    fn a_repair_owed_outlives_an_install_that_drops_the_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 40);
        drop(wal);
        // Rot a byte of the first segment's second batch: acknowledged
        // entries after it are no longer trusted.
        let seg = dir.path().join(segment_name(1));
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[BLOCK_BYTES + 100] ^= 0x20;
        std::fs::write(&seg, &bytes).unwrap();
        let reopen = || Wal::open(dir.path(), small_cfg()).unwrap();
        let (mut wal, report) = reopen();
        assert!(!report.corruption.is_empty(), "{report}");
        assert_eq!(report.restored.repair_until, Some(40));
        // The leader's snapshot, below what the log held: the install
        // drops every old segment, the damaged one with them.
        wal.install_snapshot(&snapshot(20), &[]).unwrap();
        drop(wal);
        let (mut wal, report) = reopen();
        assert!(report.corruption.is_empty(), "the damage is gone: {report}");
        assert_eq!(
            report.restored.repair_until,
            Some(40),
            "a clean, short log still owes the repair"
        );
        append_durably(&mut wal, 19);
        drop(wal);
        let (mut wal, report) = reopen();
        assert_eq!(
            report.restored.repair_until,
            Some(40),
            "39 < 40: still owed"
        );
        append_durably(&mut wal, 1);
        drop(wal);
        let (_, report) = reopen();
        assert_eq!(
            report.restored.repair_until, None,
            "durable up to 40: repaired"
        );
    }
}
