//! Adopting a staged image as the log ([`Wal::adopt_staged`]): checked
//! whole against the snapshot it belongs to and the live log's numbers,
//! then the live segments set aside and the staged files renamed into
//! their place, so the image becomes the log at once. Nothing is copied
//! and no live segment is written in place. Staging is `staged`'s.

use super::config::io_err;
use super::segments::segment_name;
use super::staged::{
    discard_staged, replaced_name, staged_name, StagedImage, MANIFEST, META, STAGED_SEGMENT_GAP,
    STAGED_SEQ_GAP,
};
use super::{Wal, WalError};
use crate::consensus::Snapshot;
use crate::storage::dir::LogDir;

impl<D: LogDir> Wal<D> {
    /// Segment and sequence numbers for an image staged now: far above
    /// the live log's, which may still grow meanwhile.
    pub fn staged_numbers(&self) -> (u64, u64) {
        (
            self.highest_segment_id().max(self.active) + STAGED_SEGMENT_GAP,
            self.next_seq + STAGED_SEQ_GAP,
        )
    }

    /// The size of a segment (a staged image's files are no larger).
    pub fn segment_bytes(&self) -> u64 {
        self.cfg.segment_bytes
    }

    /// Whether `staged` can become the log with `snap` ([`Wal::adopt_staged`]):
    /// complete, of that snapshot, and with its reserved numbers still
    /// above the live log's; if not, why.
    pub fn check_staged(&self, snap: &Snapshot, staged: &StagedImage<D>) -> Result<(), String> {
        let h = &staged.head;
        if (h.index, h.term) != (snap.index, snap.term) || !staged.complete() {
            return Err(format!(
                "the staged image of {}/{} (held {} of {}) is not the snapshot at {}/{}",
                h.index, h.term, h.held, h.total, snap.index, snap.term
            ));
        }
        let grown =
            self.highest_segment_id().max(self.active) >= h.seg_base || self.next_seq >= h.seq_base;
        if h.files > 0 && grown {
            return Err("the log grew into the numbers reserved for a staged image".into());
        }
        Ok(())
    }

    /// Replaces the whole log with a complete staged image of `snap`: the
    /// staged files become its segments, and the snapshot is recorded.
    /// Crash-safe as [`Wal::install_snapshot`]: until the snapshot is
    /// recorded, the superblock names the first staged segment as an
    /// unfinished install, which recovery removes with every later one.
    pub fn adopt_staged(
        &mut self,
        snap: &Snapshot,
        staged: StagedImage<D>,
    ) -> Result<(), WalError> {
        self.check_staged(snap, &staged)
            .map_err(WalError::Invalid)?;
        let h = &staged.head;
        if h.files == 0 {
            discard_staged(&self.dir)?;
            return self.install_snapshot(snap, &[]);
        }
        self.sync()?;
        let old = self.clear_for_install();
        self.sb.install_segment = h.seg_base;
        self.write_superblock_now()?;
        let ids: Vec<u64> = (h.seg_base..h.seg_base + h.files).collect();
        drop(staged.file);
        for &id in &ids {
            self.dir
                .rename(&staged_name(id), &segment_name(id))
                .map_err(io_err("adopting a staged segment"))?;
        }
        // The old segments step aside too: a crash once the snapshot is
        // recorded must not find them before the staged ones (a jump of
        // 2^40 sequence numbers after their zeroed ends reads as damage);
        // one before it gets them back (`install_segment`).
        for &id in &old {
            self.dir
                .rename(&segment_name(id), &replaced_name(id))
                .map_err(io_err("setting an old segment aside"))?;
        }
        self.dir
            .sync()
            .map_err(io_err("syncing the log directory"))?;
        for &id in &ids {
            let (f, _, _) = self.open_file(&segment_name(id), self.direct)?;
            self.segments.insert(id, f);
        }
        self.commit = self.commit.max(snap.index);
        self.active = *ids.last().expect("files > 0");
        self.active_recycled = false;
        // The last staged file is not grown to a segment's size: the next
        // append rolls to a fresh segment.
        self.append_offset = self.cfg.segment_bytes;
        self.index = staged.locations;
        self.uncache_from(0);
        self.next_seq = h.next_seq;
        self.durable_seq = h.next_seq - 1;
        self.last = h.last;
        let head_files = [MANIFEST, META];
        self.finish_install(snap, old, replaced_name)?;
        for name in head_files {
            let _ = self.dir.remove(name);
        }
        Ok(())
    }
}
