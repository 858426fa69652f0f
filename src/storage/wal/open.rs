//! Opening a log: the lock, the superblock, the recovery scan over the
//! segments, and zeroing a torn tail before anything is written again.

use super::*;
use crate::consensus::{HardState, RestoredState};
use crate::storage::dir::{LogDir, LogFile, OsDir};
use crate::storage::format::BLOCK_BYTES;
use crate::storage::recovery::{scan, SegmentImage};
use crate::storage::superblock::Superblock;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Duration;

impl Wal<OsDir> {
    /// Opens (or creates) the log in `dir`, recovering what it holds.
    pub fn open(dir: &Path, cfg: WalConfig) -> Result<(Wal, OpenReport), WalError> {
        Wal::open_in(OsDir::new(dir), cfg)
    }
}

impl<D: LogDir> Wal<D> {
    /// Opens (or creates) the log in `dir` (any [`LogDir`]: the simulator
    /// opens it on a simulated device), recovering what it holds.
    pub fn open_in(dir: D, cfg: WalConfig) -> Result<(Wal<D>, OpenReport), WalError> {
        let started_us = dir.now_us();
        if cfg.segment_bytes < (cfg.flush_bytes_max as u64) * 2
            || cfg.segment_bytes % BLOCK_BYTES as u64 != 0
        {
            return Err(WalError::Invalid(format!(
                "segment_bytes ({}) must be a multiple of {BLOCK_BYTES} and at least twice flush_bytes_max ({})",
                cfg.segment_bytes, cfg.flush_bytes_max
            )));
        }
        dir.create()
            .map_err(io_err(format!("creating {}", dir.describe())))?;
        let lock = match dir.lock("lock") {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(WalError::Invalid(format!(
                    "{} is in use by another process",
                    dir.describe()
                )))
            }
            Err(e) => return Err(WalError::Io("opening the lock file".into(), e)),
        };
        let (backend, backend_why) = dir
            .backend(cfg.backend, 64)
            .map_err(io_err("setting up the I/O backend"))?;

        // Superblock: two 4 KiB copies; the newer valid one wins.
        let fresh = !dir.exists("superblock");
        let (sb_file, direct, direct_why) = open_in(&dir, "superblock", cfg.direct_io)?;
        let sb = if fresh {
            None
        } else {
            let bytes = dir
                .read("superblock")
                .map_err(io_err("reading the superblock"))?;
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
            let (s, slot) = read_snapshot(&dir, sb.snapshot_index)?.ok_or_else(|| {
                WalError::Corrupt(format!(
                    "no undamaged snapshot at {} in {} (snapshot.0, snapshot.1)",
                    sb.snapshot_index,
                    dir.describe()
                ))
            })?;
            (Some(s), slot)
        } else {
            (None, None)
        };

        // An install interrupted before its snapshot was recorded: its
        // segments (the one the superblock names and every later one: the
        // kept entries may fill several) are not part of the log
        // (`Superblock::install_segment`). Gone for good before this
        // life's superblock stops naming them.
        //
        // The old segments an adopted staged image set aside
        // (`<id>.replaced`, `Wal::adopt_staged`) come back if the install
        // did not finish, and go if it did.
        let mut changed = false;
        for name in dir.list().map_err(io_err("listing the log directory"))? {
            let id = name
                .strip_suffix(".seg")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
            let replaced = name
                .strip_suffix(".replaced")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
            if sb.install_segment != 0 && id.is_some_and(|id| id >= sb.install_segment) {
                dir.remove(&name)
                    .map_err(io_err("removing an unfinished install's segment"))?;
                changed = true;
            }
            if let Some(id) = replaced {
                if sb.install_segment != 0 {
                    dir.rename(&name, &segment_name(id))
                        .map_err(io_err("restoring a segment an install set aside"))?;
                } else {
                    dir.remove(&name)
                        .map_err(io_err("removing a segment an install replaced"))?;
                }
                changed = true;
            }
        }
        if changed {
            dir.sync().map_err(io_err("syncing the log directory"))?;
        }
        // Segments, in order; leftovers of an interrupted preallocation go.
        let mut ids = Vec::new();
        for name in dir.list().map_err(io_err("listing the log directory"))? {
            // A snapshot file from before slots that the superblock does
            // not name (`snapshot.0`/`.1` are reused, never removed).
            let stray_snapshot = name.starts_with("snapshot-")
                && (snapshot_slot.is_some() || name != snapshot_name(sb.snapshot_index));
            if name.ends_with(".seg.tmp") || stray_snapshot {
                // Leftovers: a snapshot written but not adopted, or one the
                // superblock stopped naming before its removal ran.
                let _ = dir.remove(&name);
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
            .map_while(|&id| match dir.read(&segment_name(id)) {
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
        // Planted: no damage is ever "followed by too much to be torn".
        let window = if cfg.planted_truncate_on_corruption {
            u64::MAX
        } else {
            window
        };
        // Planted: nothing is known to be older than the last life either.
        let life_start = if cfg.planted_truncate_on_corruption {
            0
        } else {
            sb.life_start_seq
        };
        let found = scan(
            images,
            sb.snapshot_index,
            sb.hard_state.commit,
            window,
            life_start,
        );
        if let Some(e) = read_error {
            return Err(e);
        }

        if let Some(t) = &found.torn_tail {
            zero_range(&dir, &ids, t.zero_from, t.zero_until)?;
        }
        // Files after the one being written are preallocated spares.
        let (mut active, append_offset) = found
            .append_at
            .unwrap_or((ids.first().copied().unwrap_or(1), 0));
        let fresh_segment = ids.is_empty();
        if ids.is_empty() {
            preallocate(&dir, 1, cfg.segment_bytes)
                .map_err(io_err("preallocating the first segment"))?;
            ids.push(1);
            active = 1;
        }
        let mut segments = BTreeMap::new();
        for &id in ids.iter().filter(|&&id| id <= active) {
            let (f, _, _) = open_in(&dir, &segment_name(id), direct)?;
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
        // Damage found now, or found by an earlier open and not yet
        // repaired (a snapshot install since may have dropped the damaged
        // segments, so this scan sees a clean log): the node must not vote
        // until its log is durable up to it. Recorded in the superblock
        // written below, before the core restores from this.
        let repair_until = found.repair_until.unwrap_or(0).max(sb.repair_until);
        let repair_until = (repair_until > last.0).then_some(repair_until);
        let report = OpenReport {
            restored: RestoredState {
                hard_state,
                snapshot,
                entries: found.entries,
                repair_until,
            },
            torn_tail: found.torn_tail,
            corruption: found.corruption,
            backend: backend_why,
            direct_io: direct_why,
            segments: ids.len(),
            bytes_scanned,
            elapsed: Duration::ZERO,
        };
        let repaired = repaired::Repaired::load(&dir, sb.snapshot_index)?;
        let worker =
            Worker::start(dir.clone()).map_err(io_err("starting the log's background thread"))?;
        let mut wal = Wal {
            dir,
            backend,
            direct,
            _lock: lock,
            sb_file,
            // Always: the superblock records where this life starts (with
            // the first flush, ahead of its batch).
            sb_dirty: true,
            sb: Superblock {
                flushes_in_flight_max: cfg.flushes_in_flight_max,
                life_start_seq: found.last_seq + 1,
                install_segment: 0,
                repair_until: repair_until.unwrap_or(0),
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
            worker,
            adopting: None,
            snapshot_slot,
            active_recycled: !fresh_segment
                && !found.zeroed_segments.contains(&active)
                && found.append_recycled,
            next_seq: found.last_seq + 1,
            durable_seq: found.last_seq,
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
            cache: BTreeMap::new(),
            cache_order: VecDeque::new(),
            cache_bytes: 0,
            cold_reads: BTreeMap::new(),
            next_read_token: reads::READ_TOKEN_FIRST,
            cold_read_failures: VecDeque::new(),
            retired_files: Vec::new(),
            repaired,
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
        report.elapsed = Duration::from_micros(wal.dir.now_us().saturating_sub(started_us));
        Ok((wal, report))
    }
}

/// Zeroes `from..until` across segments, then syncs: what a torn tail
/// left behind must not be read as data by a later scan.
pub(super) fn zero_range<D: LogDir>(
    dir: &D,
    ids: &[u64],
    from: (u64, u64),
    until: (u64, u64),
) -> Result<(), WalError> {
    for &id in ids.iter().filter(|&&id| id >= from.0 && id <= until.0) {
        let (f, _, _) = dir
            .open(&segment_name(id), false)
            .map_err(io_err("opening a segment to zero"))?;
        let len = f.size_bytes().map_err(io_err("sizing a segment"))?;
        let start = if id == from.0 { from.1 } else { 0 };
        let end = if id == until.0 { until.1.min(len) } else { len };
        if end > start {
            f.write_at(&vec![0u8; (end - start) as usize], start)
                .map_err(io_err("zeroing a torn tail"))?;
            f.sync_data().map_err(io_err("syncing a zeroed tail"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_durably, indexes, small_cfg};
    use super::*;

    #[test]
    fn a_log_is_opened_by_one_process_or_thread_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        let Err(err) = Wal::open(dir.path(), small_cfg()) else {
            panic!("a second open is refused")
        };
        assert!(
            err.to_string().contains("in use by another process"),
            "{err}"
        );
        drop(wal);
        Wal::open(dir.path(), small_cfg()).expect("free again once closed");
    }

    #[test]
    fn a_reopened_log_has_its_entries_hard_state_and_append_point() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert!(report.restored.entries.is_empty());
        append_durably(&mut wal, 40);
        let hs = HardState {
            term: 3,
            vote: Some(2),
            commit: 30,
        };
        wal.set_hard_state(hs).unwrap();
        wal.wait().unwrap();
        drop(wal);
        let (mut wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(
            indexes(&report.restored.entries),
            (1..=40).collect::<Vec<_>>()
        );
        assert_eq!(report.restored.hard_state, hs);
        assert!(report.torn_tail.is_none() && report.corruption.is_empty());
        assert!(report.segments > 1, "the test wants several segments");
        // Appends go on after the last batch, not over it.
        append_durably(&mut wal, 5);
        drop(wal);
        let (_, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert_eq!(
            indexes(&report.restored.entries),
            (1..=45).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_torn_tail_is_discarded_and_zeroed_so_the_next_open_is_clean() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 3);
        let last = *wal.index.last().unwrap();
        drop(wal);
        // Tear the last batch: flip a byte inside it.
        let path = dir.path().join(segment_name(last.segment));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(last.offset + 100) as usize] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
        let torn = report.torn_tail.as_ref().expect("a torn tail");
        assert_eq!((torn.segment, torn.offset), (last.segment, last.offset));
        assert_eq!(indexes(&report.restored.entries), [1, 2]);
        drop(wal);
        let (_, again) = Wal::open(dir.path(), small_cfg()).unwrap();
        assert!(again.torn_tail.is_none(), "{again}");
        assert_eq!(indexes(&again.restored.entries), [1, 2]);
    }
}
