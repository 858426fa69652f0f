//! Entries at or below the snapshot that were repaired: copies fetched
//! from a peer (and checked against the state's [`EntryCheck`]s by the
//! caller, `node::replica::repair`) in place of copies this log lost or
//! found damaged. The segments are never rewritten in place (a torn write
//! could then hurt what was durable), so each repair goes to a file of
//! its own, `repair-<16 hex digits>.rep`, in the segments' batch format
//! (one batch per run of consecutive indexes, each record checksummed):
//! written as `.rep.tmp`, synced, renamed, and the directory synced, so a
//! crash leaves the whole file or none of it. The entries are also held
//! in memory, which is what serves them: reads of repaired entries never
//! touch the disk. At most [`REPAIRED_BYTES_MAX`] of payload are held; a
//! repair past that is refused (the log is too damaged to repair this
//! way: replace it).
//!
//! A trim that drops the entries a file holds removes the file; an
//! installed snapshot removes them all. At open, every whole batch of
//! every file is taken back (a file that does not decode is skipped
//! from its first bad batch on: its entries read as missing again and
//! are repaired again), and `.rep.tmp` leftovers go.
//!
//! [`EntryCheck`]: crate::state::EntryCheck

use super::config::io_err;
use super::*;
use crate::consensus::Payload;
use crate::storage::format::{decode_batch, BatchBuilder, Placement, BLOCK_BYTES};

/// Payload bytes of repaired entries a log holds at most.
pub const REPAIRED_BYTES_MAX: usize = 256 << 20;

/// The segment number repair batches name: no segment file ever has it
/// (segment numbers count up from 1), so recovery's scan of a segment
/// would never take such a batch for one of its own.
const REPAIR_SEGMENT: u64 = u64::MAX;

/// The name of repair file `id`.
fn repair_name(id: u64) -> String {
    format!("repair-{id:016x}.rep")
}

/// The repair file id `name` names, if it names one.
fn repair_id(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("repair-")?.strip_suffix(".rep")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// Repaired entries and the files that hold them.
#[derive(Debug, Default)]
pub(super) struct Repaired {
    entries: BTreeMap<Index, Entry>,
    /// Each file's id and the highest index it holds.
    files: BTreeMap<u64, Index>,
    payload_bytes: usize,
    next_id: u64,
}

impl Repaired {
    /// The repaired entries of `dir`'s repair files at or below
    /// `snapshot_index`; files holding nothing left to serve, and
    /// `.rep.tmp` leftovers, are removed.
    pub(super) fn load<D: LogDir>(dir: &D, snapshot_index: Index) -> Result<Repaired, WalError> {
        let mut r = Repaired::default();
        let mut removed = false;
        for name in dir.list().map_err(io_err("listing the log directory"))? {
            if name.starts_with("repair-") && name.ends_with(".rep.tmp") {
                dir.remove(&name)
                    .map_err(io_err("removing an unfinished repair"))?;
                removed = true;
                continue;
            }
            let Some(id) = repair_id(&name) else { continue };
            r.next_id = r.next_id.max(id + 1);
            let entries = read_repair_file(dir, &name);
            let kept: Vec<Entry> = entries
                .into_iter()
                .filter(|e| e.index <= snapshot_index)
                .collect();
            match kept.iter().map(|e| e.index).max() {
                None => {
                    dir.remove(&name)
                        .map_err(io_err("removing a spent repair file"))?;
                    removed = true;
                }
                Some(highest) => {
                    r.files.insert(id, highest);
                    for e in kept {
                        r.payload_bytes += payload_bytes(&e);
                        r.entries.insert(e.index, e);
                    }
                }
            }
        }
        if removed {
            dir.sync().map_err(io_err("syncing the log directory"))?;
        }
        Ok(r)
    }

    /// The repaired entry `index`, if held.
    pub(super) fn get(&self, index: Index) -> Option<&Entry> {
        self.entries.get(&index)
    }

    /// Repaired entries held.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops the entries at or below `upto`, and the files holding only
    /// such (their names are returned, for the caller to remove).
    fn forget_upto(&mut self, upto: Index) -> Vec<String> {
        let kept = match upto.checked_add(1) {
            Some(above) => self.entries.split_off(&above),
            None => BTreeMap::new(),
        };
        for e in std::mem::replace(&mut self.entries, kept).values() {
            self.payload_bytes -= payload_bytes(e);
        }
        let spent: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, &highest)| highest <= upto)
            .map(|(&id, _)| id)
            .collect();
        spent
            .into_iter()
            .map(|id| {
                self.files.remove(&id);
                repair_name(id)
            })
            .collect()
    }
}

fn payload_bytes(e: &Entry) -> usize {
    match &e.payload {
        Payload::Normal(p) => p.len(),
        _ => 0,
    }
}

/// Every entry of the whole batches at the start of repair file `name`
/// (nothing, if it cannot be read).
fn read_repair_file<D: LogDir>(dir: &D, name: &str) -> Vec<Entry> {
    let Ok(bytes) = dir.read(name) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at + BLOCK_BYTES <= bytes.len() {
        let Ok(batch) = decode_batch(&bytes[at..]) else {
            break;
        };
        if batch.place.segment != REPAIR_SEGMENT {
            break;
        }
        at += batch.disk_bytes;
        out.extend(batch.entries);
    }
    out
}

impl<D: LogDir> Wal<D> {
    /// Stores `entries` (ascending, each at or below the snapshot, none
    /// held already) durably as repaired copies, and serves them from now
    /// on: only once this returns Ok may the caller answer with them. The
    /// write is synchronous (a file write, its fdatasync, a rename and a
    /// directory fsync), like a snapshot's compaction: repairs are rare
    /// and bounded per call by what one message carries.
    pub fn store_repaired(&mut self, entries: &[Entry]) -> Result<(), WalError> {
        let Some(last) = entries.last() else {
            return Ok(());
        };
        let ascending = entries.windows(2).all(|w| w[0].index < w[1].index);
        if !ascending || last.index > self.snapshot_index {
            return Err(WalError::Invalid(format!(
                "repaired entries must be ascending and at or below the snapshot ({})",
                self.snapshot_index
            )));
        }
        if let Some(e) = entries
            .iter()
            .find(|e| self.repaired.get(e.index).is_some())
        {
            return Err(WalError::Invalid(format!(
                "entry {} is repaired already",
                e.index
            )));
        }
        let adding: usize = entries.iter().map(payload_bytes).sum();
        if self.repaired.payload_bytes + adding > REPAIRED_BYTES_MAX {
            return Err(WalError::Invalid(format!(
                "repairing {} more bytes would hold more than {REPAIRED_BYTES_MAX} bytes of repaired entries: this log is too damaged to repair entry by entry; replace it (HARDWARE.md, \"Replacing a disk\")",
                adding
            )));
        }
        self.check_not_failed()?;
        self.check_entry_sizes(entries)?;
        let mut bytes = Vec::new();
        let mut run_start = 0;
        for i in 1..=entries.len() {
            let run_ends = i == entries.len() || entries[i].index != entries[i - 1].index + 1;
            if !run_ends {
                continue;
            }
            let run = &entries[run_start..i];
            let mut b = BatchBuilder::new(run[0].index);
            for e in run {
                b.push(e);
            }
            let place = Placement {
                segment: REPAIR_SEGMENT,
                recycled: false,
            };
            bytes.extend_from_slice(b.finish(0, 0, place).as_slice());
            run_start = i;
        }
        let id = self.repaired.next_id;
        let (name, tmp) = (repair_name(id), format!("{}.tmp", repair_name(id)));
        let write = || -> std::io::Result<()> {
            let f = self.dir.create_new(&tmp)?;
            f.write_at(&bytes, 0)?;
            f.sync_data()?;
            self.dir.rename(&tmp, &name)?;
            self.dir.sync()
        };
        if let Err(e) = write() {
            let _ = self.dir.remove(&tmp);
            if is_enospc(&e) {
                return Err(WalError::DiskFull);
            }
            return Err(WalError::Io(format!("writing {name}"), e));
        }
        self.repaired.next_id += 1;
        self.repaired.files.insert(id, last.index);
        self.repaired.payload_bytes += adding;
        for e in entries {
            self.repaired.entries.insert(e.index, e.clone());
        }
        self.metrics.entries_repaired += entries.len() as u64;
        Ok(())
    }

    /// Repaired entries held now.
    pub fn repaired_entries(&self) -> usize {
        self.repaired.len()
    }

    /// Drops the repaired entries at or below `upto` and removes the
    /// files that held only such (a trim freed what they repaired).
    pub(super) fn forget_repaired_upto(&mut self, upto: Index) -> Result<(), WalError> {
        let spent = self.repaired.forget_upto(upto);
        for name in &spent {
            self.dir
                .remove(name)
                .map_err(io_err("removing a spent repair file"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_durably, entry, small_cfg, snapshot};
    use super::*;

    /// A snapshot at `index` whose state refers to entries from
    /// `keep_from` on, adopted and durable.
    fn adopt_snapshot_keeping(wal: &mut Wal, index: Index, keep_from: Index) {
        write_snapshot_file(&wal.free_snapshot_slot(), &snapshot(index)).unwrap();
        wal.adopt_snapshot(index, 1, Some(keep_from)).unwrap();
        wal.sync().unwrap();
    }

    /// A log of 40 entries with a snapshot at 30 keeping entries from 5
    /// on, open in `dir`, and the location of the batch holding `index`.
    fn log_with_snapshot(dir: &std::path::Path, index: Index) -> (Wal, BatchLocation) {
        let (mut wal, _) = Wal::open(dir, small_cfg()).unwrap();
        append_durably(&mut wal, 40);
        adopt_snapshot_keeping(&mut wal, 30, 5);
        let (_, loc) = wal.locate(index, index).unwrap().remove(0);
        (wal, loc)
    }

    /// One bit of the batch at `loc` flips on the platter.
    fn rot(dir: &std::path::Path, loc: &BatchLocation) {
        let path = dir.join(super::super::segments::segment_name(loc.segment));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[loc.offset as usize + 100] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
    }

    /// The indexes the batch at `loc` holds.
    fn held(loc: &BatchLocation) -> Vec<Index> {
        (loc.first_index..loc.first_index + loc.count).collect()
    }

    fn repair_files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("repair-"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn repaired_entries_are_durable_served_and_trimmed_with_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 40);
        // A snapshot at 30 keeping everything from 5 (the state refers to
        // entries from there on).
        adopt_snapshot_keeping(&mut wal, 30, 5);
        // Above the snapshot, out of order, or twice: refused.
        assert!(wal.store_repaired(&[entry(31)]).is_err());
        assert!(wal.store_repaired(&[entry(8), entry(7)]).is_err());
        wal.store_repaired(&[entry(7), entry(8), entry(12)])
            .unwrap();
        assert!(wal.store_repaired(&[entry(12)]).is_err());
        assert_eq!(wal.repaired_entries(), 3);
        assert_eq!(wal.metrics().entries_repaired, 3);
        assert_eq!(repair_files(dir.path()), ["repair-0000000000000000.rep"]);
        match wal.cached(12).unwrap() {
            CachedRead::Entry(e) => assert_eq!(e, entry(12)),
            other => panic!("{other:?}"),
        }
        assert_eq!(wal.read(7, 8).unwrap(), vec![entry(7), entry(8)]);

        // Reopened: the same entries, from the file.
        drop(wal);
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(wal.repaired_entries(), 3);
        assert_eq!(wal.read(12, 12).unwrap(), vec![entry(12)]);

        // A trim past them drops them and their file.
        wal.forget_repaired_upto(10).unwrap();
        assert_eq!(wal.repaired_entries(), 1, "12 is kept");
        assert_eq!(repair_files(dir.path()).len(), 1);
        wal.forget_repaired_upto(12).unwrap();
        assert_eq!(wal.repaired_entries(), 0);
        assert!(repair_files(dir.path()).is_empty());
    }

    #[test]
    fn a_damaged_or_unfinished_repair_file_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 40);
        adopt_snapshot_keeping(&mut wal, 30, 5);
        wal.store_repaired(&[entry(7)]).unwrap();
        wal.store_repaired(&[entry(9)]).unwrap();
        drop(wal);
        // The first file rots; a crash left a temporary one.
        let first = dir.path().join("repair-0000000000000000.rep");
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[40] ^= 1;
        std::fs::write(&first, bytes).unwrap();
        std::fs::write(dir.path().join("repair-0000000000000005.rep.tmp"), b"x").unwrap();
        let (wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(wal.repaired_entries(), 1, "only entry 9's file decodes");
        assert!(wal.repaired.get(9).is_some() && wal.repaired.get(7).is_none());
        assert!(!repair_files(dir.path()).iter().any(|n| n.ends_with(".tmp")));
    }

    #[test]
    fn an_entry_that_rotted_below_the_snapshot_is_served_once_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, loc) = log_with_snapshot(dir.path(), 7);
        drop(wal);
        rot(dir.path(), &loc);
        let (mut wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert!(!report.corruption.is_empty(), "the scan saw it");
        let lost = held(&loc);
        assert!(lost.iter().all(|&i| !wal.holds(i)), "the batch is gone");
        assert!(wal.read(7, 7).is_err());
        let copies: Vec<Entry> = lost.iter().map(|&i| entry(i)).collect();
        wal.store_repaired(&copies).unwrap();
        assert!(lost.iter().all(|&i| wal.holds(i)));
        assert_eq!(
            wal.read(5, 12).unwrap(),
            (5..=12).map(entry).collect::<Vec<_>>()
        );
        // Still there after a restart.
        drop(wal);
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(wal.read(7, 7).unwrap(), vec![entry(7)]);
    }

    /// The scrub reads every durable batch in chunks and finds one that
    /// rotted while the log was open; distrusting it (below the snapshot)
    /// makes its entries missing until repaired copies stand in.
    #[test]
    fn a_scrub_finds_a_batch_that_rotted_under_an_open_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, loc) = log_with_snapshot(dir.path(), 9);
        rot(dir.path(), &loc);
        // Read in small chunks, as the scrub does, from the lowest batch.
        let (mut damaged, mut good, mut from) = (Vec::new(), 0, 0);
        loop {
            let batches = wal.batches_from(from, 1);
            let Some(last) = batches.last() else {
                break;
            };
            from = last.first_index + last.count;
            let r = crate::storage::scrub_located(wal.dir(), &batches);
            good += r.good_batches;
            damaged.extend(r.damaged);
        }
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].0, loc);
        assert!(good > 0);
        assert_eq!(from, 41, "the whole durable log was read");
        assert!(wal.distrust_batch(&loc));
        assert!(!wal.distrust_batch(&loc), "once");
        let lost = held(&loc);
        assert!(lost.iter().all(|&i| !wal.holds(i)));
        assert_eq!(wal.gaps(5, 31, 1000), lost);
        let copies: Vec<Entry> = lost.iter().map(|&i| entry(i)).collect();
        wal.store_repaired(&copies).unwrap();
        assert_eq!(wal.read(9, 9).unwrap(), vec![entry(9)]);
        // A batch of the live log is left to recovery.
        let (_, live) = wal.locate(35, 35).unwrap().remove(0);
        assert!(!wal.distrust_batch(&live));
        assert!(wal.holds(35));
    }

    /// A snapshot image needs the whole range below the snapshot: the
    /// gaps a lost batch left are listed, and once repaired the image's
    /// range reads back whole, from the segments and the repaired copies.
    #[test]
    fn an_image_range_lists_its_gaps_and_reads_repaired_copies_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, loc) = log_with_snapshot(dir.path(), 9);
        drop(wal);
        rot(dir.path(), &loc);
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        let lost = held(&loc);
        assert_eq!(wal.gaps(5, 31, 1000), lost);
        assert_eq!(wal.gaps(5, 31, 1), lost[..1].to_vec(), "bounded");
        assert!(wal.locate_with_repaired(5, 30).is_err());
        // Half repaired: the rest are still gaps.
        let (first, rest) = lost.split_at(lost.len() / 2);
        let copies: Vec<Entry> = first.iter().map(|&i| entry(i)).collect();
        wal.store_repaired(&copies).unwrap();
        assert_eq!(wal.gaps(5, 31, 1000), rest);
        let copies: Vec<Entry> = rest.iter().map(|&i| entry(i)).collect();
        wal.store_repaired(&copies).unwrap();
        assert!(wal.gaps(5, 31, 1000).is_empty());
        let located = wal.locate_with_repaired(5, 30).unwrap();
        assert_eq!(located.repaired.len(), lost.len());
        assert_eq!(
            located.read(wal.dir(), 5, 30).unwrap(),
            (5..=30).map(entry).collect::<Vec<_>>()
        );
    }
}
