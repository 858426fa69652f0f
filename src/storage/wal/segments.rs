//! Segments: rolling to the next one, spares prepared ahead or recycled from
//! trimmed segments, and the trim below a snapshot.

use super::*;
use crate::consensus::Index;
use std::collections::BTreeMap;

/// The file name of segment `id`.
pub(super) fn segment_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// Opens data file `name` of `dir`, naming it in the error.
pub(super) fn open_in<D: LogDir>(
    dir: &D,
    name: &str,
    direct: bool,
) -> Result<(D::File, bool, String), WalError> {
    dir.open(name, direct)
        .map_err(io_err(format!("opening {}/{name}", dir.describe())))
}

impl<D: LogDir> Wal<D> {
    /// Opens a data file of the log (O_DIRECT if `direct` and accepted).
    pub(super) fn open_file(
        &self,
        name: &str,
        direct: bool,
    ) -> Result<(D::File, bool, String), WalError> {
        open_in(&self.dir, name, direct)
    }

    /// Moves writing to the next segment; false if there is no space for
    /// one (the disk is full).
    pub(super) fn roll_segment(&mut self) -> Result<bool, WalError> {
        // The lowest ready spare; else wait for the one being prepared;
        // else prepare one now.
        self.collect_spare(self.ready_spares.is_empty())?;
        // A recycled or renumbered spare's new name must be durable before
        // it is written: recovery orders segments by name.
        self.finish_dir_sync()?;
        let ready = self.ready_spares.pop_first();
        let next = ready.unwrap_or_else(|| self.highest_segment_id() + 1);
        if ready.is_none() {
            let now = self.dir.now_us();
            if self.state == DiskState::Full
                && self
                    .last_space_retry
                    .is_some_and(|t| now.saturating_sub(t) < self.cfg.space_retry_ms * 1000)
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
        let (f, _, _) = self.open_file(&segment_name(next), self.direct)?;
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

    /// Waits for the log's background work to finish: a spare being
    /// zero-filled, a directory sync (their errors surface here).
    pub fn quiesce(&mut self) -> Result<(), WalError> {
        self.collect_spare(true)?;
        self.finish_dir_sync()
    }

    /// Waits for the background directory fsync, if one runs.
    pub(super) fn finish_dir_sync(&mut self) -> Result<(), WalError> {
        match self.dir_sync.take() {
            None => Ok(()),
            Some(job) => self
                .worker
                .wait(job)
                .map_err(io_err("syncing the log directory")),
        }
    }

    /// Starts a directory fsync off the loop (after a rename): right after
    /// a snapshot the journal is busy and one can take many milliseconds.
    /// `roll_segment` waits for it before writing into a renamed spare.
    pub(super) fn start_dir_sync(&mut self) -> Result<(), WalError> {
        self.finish_dir_sync()?;
        self.dir_sync = Some(self.worker.submit(Job::SyncDir));
        Ok(())
    }

    /// Collects a finished background zero-fill (waiting for it with
    /// `block`). Running out of space there is not an error yet: the roll
    /// that needs the segment will find out.
    pub(super) fn collect_spare(&mut self, block: bool) -> Result<(), WalError> {
        let Some((id, job)) = self.spare else {
            return Ok(());
        };
        let result = if block {
            Some(self.worker.wait(job))
        } else {
            self.worker.poll(job)
        };
        let Some(result) = result else {
            return Ok(());
        };
        self.spare = None;
        match result {
            Ok(()) => {
                // Segments must be written in the order of their numbers
                // (recovery reads them so). A trim may have recycled files
                // under higher numbers while this one was being prepared,
                // and the roll may have used one: then this spare is
                // renumbered past them.
                let highest = self.highest_segment_id();
                let id = if id < highest {
                    let to = highest + 1;
                    self.dir
                        .rename(&segment_name(id), &segment_name(to))
                        .map_err(io_err("renumbering a spare segment"))?;
                    self.start_dir_sync()?;
                    to
                } else {
                    id
                };
                self.ready_spares.insert(id);
            }
            Err(e) if is_enospc(&e) => {}
            Err(e) => return Err(WalError::Io(format!("preallocating segment {id}"), e)),
        }
        Ok(())
    }

    /// Starts preparing the next spare in the background if fewer than
    /// `segments_ahead` are ready (one preparation at a time).
    pub(super) fn top_up_spares(&mut self) {
        if self.spare.is_some() || self.ready_spares.len() >= self.cfg.segments_ahead as usize {
            return;
        }
        self.start_zero_fill();
    }

    /// Starts zero-filling a new spare segment in the background.
    pub(super) fn start_zero_fill(&mut self) {
        let id = self.highest_segment_id() + 1;
        let bytes = self.cfg.segment_bytes;
        self.metrics.segments_zero_filled += 1;
        self.spare = Some((id, self.worker.submit(Job::Preallocate { id, bytes })));
    }

    /// The highest segment number in use: written, spare or being prepared.
    pub(super) fn highest_segment_id(&self) -> u64 {
        let spares = self.ready_spares.last().copied().unwrap_or(0);
        let preparing = self.spare.map_or(0, |(id, _)| id);
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
}

impl<D: LogDir> Wal<D> {
    pub(super) fn trim_segments(&mut self, upto: Index) -> Result<(), WalError> {
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
            self.retire_segment(*id);
            let name = segment_name(*id);
            if self.ready_spares.len() < self.cfg.segments_recycled_max as usize {
                // Reused under a new, higher number: its old batches name
                // the old number, so recovery reads them as free space.
                let new_id = self.highest_segment_id() + 1;
                self.dir
                    .rename(&name, &segment_name(new_id))
                    .map_err(io_err("recycling a segment"))?;
                self.ready_spares.insert(new_id);
                self.recycled_spares.insert(new_id);
                self.metrics.segments_recycled += 1;
            } else {
                self.dir
                    .remove(&name)
                    .map_err(io_err("removing a segment"))?;
            }
        }
        if !doomed.is_empty() {
            self.start_dir_sync()?;
        }
        self.index.retain(|b| !doomed.contains(&b.segment));
        self.forget_repaired_upto(upto)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_durably, small_cfg, snapshot};
    use super::*;

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
            std::fs::remove_file(dir.path().join(segment_name(id))).unwrap();
        }
        wal.recycled_spares.clear();
        let slow = wal.highest_segment_id() + 1;
        let held = wal.worker.reserve();
        wal.spare = Some((slow, held));
        // The trim recycles the segments below the snapshot past `slow`.
        let snap = snapshot(wal.durable().0);
        wal.compact(&snap).unwrap();
        assert!(wal.ready_spares.first().is_some_and(|&id| id > slow));
        let mut written = vec![wal.active, append_until_roll(&mut wal)];
        assert!(written[1] > slow, "the roll took a recycled spare first");
        preallocate(&wal.dir, slow, wal.cfg.segment_bytes).unwrap();
        wal.worker.complete(held, Ok(()));
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

    #[test]
    fn trimmed_segments_become_recycled_spares_under_higher_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        while wal.active < 5 {
            append_until_roll(&mut wal);
        }
        let written: Vec<u64> = wal.segments.keys().copied().collect();
        wal.compact(&snapshot(wal.durable().0)).unwrap();
        assert_eq!(
            wal.segments.keys().copied().collect::<Vec<_>>(),
            [wal.active]
        );
        assert!(wal.metrics().segments_recycled > 0);
        let top = *written.last().unwrap();
        assert!(wal.recycled_spares.iter().all(|&id| id > top));
        assert!(wal.recycled_spares.is_subset(&wal.ready_spares));
        // The next roll writes into a recycled file and says so.
        append_until_roll(&mut wal);
        assert!(wal.active_recycled);
        assert!(!wal.holds(1), "trimmed entries are gone");
    }
}
