//! The snapshot pipeline of a replica: a snapshot is due when the log
//! grew (Raft asks) or at the interval; the loop captures the state (an
//! O(1) copy of the persistent maps: ledgers, queues, dedup table), a
//! helper thread encodes it and writes it to the WAL's free slot, and the
//! loop adopts it (Raft compacts, the WAL names it in the superblock)
//! only once the log is durable up to its index: its state may refer to
//! those entries. For a follower behind the trimmed log, the snapshot's
//! image (the snapshot with the entries its state refers to) is read from
//! the segments and encoded on a helper thread too.
//!
//! The helper threads and the clock that times the pipeline are the
//! host's (`Host::offload`, `Host::now_us`): the daemon's run jobs on
//! threads, a simulator's when its seed says.

use super::tap::{GlueBug, WorkloadBug};
use super::Replica;
use crate::consensus::image::{
    decode_entries, encode_entries, encoded_entry_bytes, ImageHeader, IMAGE_HEADER_BYTES,
};
use crate::consensus::{ImageChunk, ImageRead, Index, Term};
use crate::node::log::log_warn;
use crate::node::loops::host::{Host, JobState, Offloaded};
use crate::storage::wal::{drop_staged, remove_dropped, StagedImage};
use crate::storage::{LogDir, WalError};

/// A snapshot written by the helper thread: the snapshot, its bytes, and
/// the lowest log index its state refers to.
pub(super) type SnapshotWritten = (crate::consensus::Snapshot, usize, Option<Index>);

/// A chunk of a snapshot image being read from the segments on a helper
/// thread, for a follower behind the trimmed log.
pub(super) struct ImageReadJob {
    read: ImageRead,
    total: u64,
    done: Box<dyn Offloaded<Result<ChunkRead, WalError>>>,
}

/// A chunk of entries read for an image: its bytes, and how many entries
/// (positions) it holds.
type ChunkRead = (Vec<u8>, u64);

/// Why a chunk was not staged.
pub(super) enum StageError {
    /// It is not part of a valid image (it came over the network).
    Refused(String),
    /// The disk failed.
    Failed(WalError),
}

/// What staging a chunk came to: the staged image (unless it had to go),
/// and the snapshot's data once the image is complete.
type Staged<D> = (Option<StagedImage<D>>, Result<Option<Vec<u8>>, StageError>);

/// A chunk of an image from the leader being staged on a helper thread.
pub(super) struct StageJob<D: LogDir> {
    index: Index,
    term: Term,
    done: Box<dyn Offloaded<Staged<D>>>,
}

/// A snapshot being encoded and written on a helper thread.
pub(super) struct SnapshotJob {
    index: Index,
    /// When the capture started, on the host's clock.
    started_us: u64,
    pub(super) done: Box<dyn Offloaded<Result<SnapshotWritten, WalError>>>,
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Takes a snapshot at least every `interval_ms`, the first one at a
    /// random point (from `seed`) between half and one and a half
    /// intervals from `now_ms`: replicas started together do not all
    /// snapshot at once, and a commit needs only a majority of them.
    pub(crate) fn set_snapshot_interval(&mut self, interval_ms: u64, now_ms: u64, seed: u64) {
        self.snapshot_interval_ms = interval_ms;
        let phase = seed % interval_ms.max(1);
        self.next_snapshot_ms = now_ms.saturating_add(interval_ms / 2).saturating_add(phase);
    }

    /// Starts a snapshot when one is due (log growth or the interval) and
    /// adopts one that finished. The loop only captures the state: the
    /// ledgers, queues and dedup table are persistent maps, so their copy
    /// is O(1) and shares everything with the live state (copy-on-write;
    /// `capture_us` measures it).
    /// Encoding and the fsynced file write run on a helper thread, so
    /// appends do not wait for them.
    pub(super) fn snapshot(&mut self, now_ms: u64) {
        if let Some(job) = &mut self.snapshot_job {
            let index = job.index;
            match job.done.try_take() {
                JobState::Running => return,
                JobState::Lost => {
                    self.snapshot_job = None;
                    self.snapshot_stats.failed += 1;
                }
                JobState::Done(Err(e)) => {
                    log_warn!("group {}: snapshot at {index} not written: {e}", self.group);
                    self.snapshot_job = None;
                    self.snapshot_stats.failed += 1;
                }
                JobState::Done(Ok(written)) => {
                    let job = self.snapshot_job.take().expect("checked above");
                    self.snapshot_written = Some((written, job.started_us));
                }
            }
        }
        // Adopted once the log is durable up to the snapshot: its state may
        // refer to those entries, and Raft forgets them from memory then.
        let durable = self.wal.durable().0;
        if let Some(((snap, _, _), _)) = &self.snapshot_written {
            if durable >= snap.index {
                let ((snap, bytes, keep_from), started_us) =
                    self.snapshot_written.take().expect("checked above");
                let (index, term) = (snap.index, snap.term);
                // Refused if the leader installed a newer one meanwhile.
                if let Ok(replaced) = self.raft.compact_prepared(snap) {
                    self.not_applied = self
                        .not_applied
                        .split_off(&crate::state::dedup::record_address(index + 1, 0));
                    if let Some(old) = replaced.filter(|o| o.data.len() > 1 << 20) {
                        // Freed off the loop: returning tens of MB to
                        // the OS (munmap) takes milliseconds.
                        let _ = self
                            .host
                            .offload("quire-free".into(), false, move || drop(old));
                    }
                    self.set_keep_from(index, keep_from);
                    // Segments a follower's image still reads stay too.
                    let trim_keep = self.keep_from_for_transfers();
                    if let Err(e) = self.wal.adopt_snapshot(index, term, trim_keep) {
                        self.stop(format!("{e}"));
                        return;
                    }
                    let ticket = self.wal.current_ticket();
                    self.note(|| super::tap::Note::Adopted { index, ticket });
                    let s = &mut self.snapshot_stats;
                    s.taken += 1;
                    s.last_index = index;
                    s.last_bytes = bytes as u64;
                    s.last_us = self.host.now_us().saturating_sub(started_us);
                }
                // Else the leader installed a newer one meanwhile: the
                // slot this one was written to is simply written over.
            }
        }
        if self.snapshot_written.is_some() {
            return;
        }
        let snapshot_index = self.raft.snapshot().map_or(0, |s| s.index);
        let interval = now_ms >= self.next_snapshot_ms;
        if !(self.snapshot_due || interval) || self.applied <= snapshot_index {
            return;
        }
        let Ok((term, membership)) = self.raft.snapshot_meta(self.applied) else {
            return;
        };
        let started_us = self.host.now_us();
        let (index, hash) = (self.applied, self.applied_hash);
        let (dedup, machine) = (self.dedup.clone(), self.machine.clone());
        let leave_out = self.planted_workload == Some(WorkloadBug::SnapshotWithoutMachine);
        let synced = self.planted != Some(GlueBug::AdoptUnsyncedSnapshot);
        let capture_us = self.host.now_us().saturating_sub(started_us);
        let (dir, slot) = (self.wal.dir().clone(), self.wal.free_slot_name());
        let name = format!("quire-snap-g{}", self.group);
        let offloaded = self.host.offload(name, true, move || {
            let mut data = hash.to_le_bytes().to_vec();
            dedup.encode(&mut data);
            if leave_out {
                data.extend_from_slice(&crate::state::StateMachine::new().snapshot());
            } else {
                data.extend_from_slice(&machine.snapshot());
            }
            let bytes = data.len();
            let keep_from = machine.oldest_stored();
            let snap = crate::consensus::Snapshot {
                index,
                term,
                membership,
                data,
            };
            crate::storage::wal::write_snapshot_synced_or_not(&dir, &slot, &snap, synced)
                .map(|()| (snap, bytes, keep_from))
        });
        let Ok(done) = offloaded else {
            self.snapshot_stats.failed += 1;
            return;
        };
        self.snapshot_due = false;
        self.next_snapshot_ms = now_ms.saturating_add(self.snapshot_interval_ms);
        self.snapshot_stats.last_capture_us = capture_us;
        self.snapshot_job = Some(SnapshotJob {
            index,
            started_us,
            done,
        });
    }

    /// The state at the snapshot at `index` refers to the log from
    /// `keep_from`: kept for the images of this snapshot and of any
    /// replaced one a follower is still receiving (Raft keeps that
    /// transfer going rather than start over with each new snapshot).
    pub(super) fn set_keep_from(&mut self, index: Index, keep_from: Option<Index>) {
        // Index 0 holds no entry, so 0 can stand for "none".
        self.snapshot_stats.retained_from = keep_from.unwrap_or(0);
        self.keep_from_by_snapshot.insert(index, keep_from);
        let gone: Vec<Index> = self
            .keep_from_by_snapshot
            .keys()
            .copied()
            .filter(|&i| i != index && self.raft.transfer_snapshot(i).is_none())
            .collect();
        for i in gone {
            self.keep_from_by_snapshot.remove(&i);
        }
    }

    /// The lowest log index an image still to be sent refers to: the
    /// current snapshot's, or a replaced one's still being received.
    fn keep_from_for_transfers(&self) -> Option<Index> {
        self.keep_from_by_snapshot.values().flatten().copied().min()
    }

    /// The lowest log index the state at Raft's snapshot refers to.
    pub(super) fn keep_from(&self) -> Option<Index> {
        Some(self.snapshot_stats.retained_from).filter(|&i| i > 0)
    }

    /// The header of the image of the snapshot at `index` (the current
    /// one, or one replaced while still being sent), if it is held.
    fn image_header(&self, index: Index) -> Option<ImageHeader> {
        let snap = self.raft.transfer_snapshot(index)?;
        let &keep_from = self.keep_from_by_snapshot.get(&index)?;
        let leave_out = self.planted_workload == Some(WorkloadBug::SnapshotWithoutEntries);
        let keep_from = keep_from.filter(|_| !leave_out);
        Some(ImageHeader::new(index, snap.data.len() as u64, keep_from))
    }

    /// Leader: reads the chunk of a snapshot image Raft asks for (a
    /// follower is behind the trimmed log). The header and the snapshot's
    /// data are in memory; entries are read from the segments (or taken
    /// from the copies repaired from peers) on a helper thread, a chunk's
    /// worth at a time, so neither the loop nor memory carries the image.
    pub(super) fn read_image_chunk(&mut self, read: ImageRead) {
        let chunk_bytes = self.raft.snapshot_chunk_bytes().max(1);
        let (Some(header), Some(snap)) = (
            self.image_header(read.index),
            self.raft.transfer_snapshot(read.index),
        ) else {
            self.raft.image_unavailable(read.to, read.index);
            return;
        };
        let (total, position) = (header.total(), read.position);
        if position < header.meta_end() {
            let end = header.meta_end().min(position + chunk_bytes as u64);
            let head = header.encode();
            let mut out = Vec::with_capacity((end - position) as usize);
            let h = head.len() as u64;
            if position < h {
                out.extend_from_slice(&head[position as usize..end.min(h) as usize]);
            }
            if end > h {
                out.extend_from_slice(
                    &snap.data[(position.max(h) - h) as usize..(end - h) as usize],
                );
            }
            self.image_read_ahead.retain(|j| j.read.to != read.to);
            let sent = self
                .raft
                .send_image_chunk(read.to, read.index, position, total, out);
            self.snapshot_stats.image_chunks_sent += u64::from(sent);
            if sent && end == header.meta_end() {
                self.read_ahead(read, end, total);
            }
            return;
        }
        if header.entry_at(position).is_none() {
            return; // past the end: a confused follower, dropped
        }
        // The chunk read ahead for this follower, if it is this one;
        // one for another position is of no use now.
        let ahead = self
            .image_read_ahead
            .iter()
            .position(|j| j.read.to == read.to);
        if let Some(mut job) = ahead.map(|i| self.image_read_ahead.swap_remove(i)) {
            if job.read == read {
                self.image_reads.retain(|j| j.read.to != read.to);
                match job.done.try_take() {
                    // Still reading: sent when done, like any read.
                    JobState::Running => {
                        self.image_reads.push(job);
                        return;
                    }
                    // Most often read already: sent now, in this Ready
                    // round (its wake-up came before it was wanted).
                    JobState::Done(Ok(chunk)) => {
                        self.image_read_done(read, job.total, Ok(chunk));
                        return;
                    }
                    // Read before a repair, say: read again now rather
                    // than fail the ask with an old answer.
                    JobState::Done(Err(_)) | JobState::Lost => {}
                }
            }
        }
        match self.start_image_read(read, &header) {
            Ok(job) => {
                // One read per follower: a newer ask replaces an older one.
                self.image_reads.retain(|j| j.read.to != read.to);
                self.image_reads.push(job);
            }
            Err(()) => self.raft.image_unavailable(read.to, read.index),
        }
    }

    /// Starts reading the entries of the image chunk `read` asks for (at
    /// an entry's position of the image `header` describes) on a helper
    /// thread; `Err` (logged) if the entries cannot be located.
    fn start_image_read(
        &mut self,
        read: ImageRead,
        header: &ImageHeader,
    ) -> Result<ImageReadJob, ()> {
        let chunk_bytes = self.raft.snapshot_chunk_bytes().max(1);
        let total = header.total();
        let first = header.entry_at(read.position).ok_or(())?;
        let located = self
            .wal
            .locate_with_repaired_bytes(first, read.index, chunk_bytes as u64)
            .map_err(|e| {
                log_warn!(
                    "group {}: locating entry {first} for an image of the snapshot at {}: {e}",
                    self.group,
                    read.index
                )
            })?;
        let name = format!("quire-image-g{}", self.group);
        let dir = self.wal.dir().clone();
        let last = read.index;
        let offloaded = self.host.offload(name, true, move || {
            let entries = located.read(&dir, first, last)?;
            if entries.first().map(|e| e.index) != Some(first) {
                return Err(WalError::Invalid(format!("entry {first} not read")));
            }
            // Whole entries up to a chunk, at least one.
            let mut bytes = 0;
            let fit = entries
                .iter()
                .take_while(|e| {
                    bytes += encoded_entry_bytes(e);
                    bytes <= chunk_bytes
                })
                .count()
                .max(1);
            let mut out = Vec::with_capacity(bytes.min(chunk_bytes));
            encode_entries(&entries[..fit], &mut out);
            Ok((out, fit as u64))
        });
        let done = offloaded.map_err(|_| ())?;
        Ok(ImageReadJob { read, total, done })
    }

    /// Leader: reads the chunk after one just sent (ending at `end`) for
    /// the same follower, so that it is ready when the follower's ack
    /// asks for it: the read then overlaps the follower's staging instead
    /// of following it. At most one per follower, dropped if Raft asks
    /// for another position, or once the snapshot's transfer is no
    /// longer held or the leadership is gone (a follower that caught up
    /// otherwise leaves its one until then).
    fn read_ahead(&mut self, read: ImageRead, end: u64, total: u64) {
        self.image_read_ahead.retain(|j| j.read.to != read.to);
        let Some(header) = self.image_header(read.index) else {
            return;
        };
        if end >= total || header.total() != total {
            return;
        }
        let next = ImageRead {
            position: end,
            ..read
        };
        if let Ok(job) = self.start_image_read(next, &header) {
            self.image_read_ahead.push(job);
        }
    }

    /// Hands finished image chunks to Raft to send.
    pub(super) fn poll_image_reads(&mut self) {
        // Chunks read ahead for a transfer that is over, or by a leader
        // no more, are dropped (each holds a chunk's bytes).
        if !self.image_read_ahead.is_empty() {
            let leads = self.raft.role() == crate::consensus::Role::Leader;
            let raft = &self.raft;
            self.image_read_ahead
                .retain(|j| leads && raft.transfer_snapshot(j.read.index).is_some());
        }
        let mut i = 0;
        while i < self.image_reads.len() {
            let job = &mut self.image_reads[i];
            let (read, total) = (job.read, job.total);
            match job.done.try_take() {
                JobState::Running => i += 1,
                JobState::Lost => drop(self.image_reads.swap_remove(i)),
                JobState::Done(r) => {
                    self.image_reads.swap_remove(i);
                    self.image_read_done(read, total, r);
                }
            }
        }
    }

    /// A chunk of entries read for `read`: sent (and the next one read
    /// ahead, if Raft took it), or the failure told to Raft.
    fn image_read_done(&mut self, read: ImageRead, total: u64, r: Result<ChunkRead, WalError>) {
        match r {
            Ok((chunk, entries)) => {
                let sent =
                    self.raft
                        .send_image_chunk(read.to, read.index, read.position, total, chunk);
                self.snapshot_stats.image_chunks_sent += u64::from(sent);
                if sent {
                    self.read_ahead(read, read.position + entries, total);
                }
            }
            Err(e) => {
                log_warn!(
                    "group {}: reading an image of the snapshot at {} at position {}: {e}",
                    self.group,
                    read.index,
                    read.position
                );
                self.raft.image_unavailable(read.to, read.index);
            }
        }
    }

    /// Follower: stages a chunk of an image from the leader on a helper
    /// thread: header and state bytes to `staged.meta`, entries as a batch
    /// of a staged segment, durable before Raft acknowledges it.
    pub(super) fn stage_image_chunk(&mut self, chunk: ImageChunk) {
        let (index, term) = (chunk.snapshot.index, chunk.snapshot.term);
        let same = |s: &StagedImage<D>| {
            (s.head.index, s.head.term, s.head.total) == (index, term, chunk.total)
                && chunk.offset > 0
        };
        let staged = self.staged.take().filter(same);
        let dir = self.wal.dir().clone();
        let numbers = self.wal.staged_numbers();
        let segment_bytes = self.wal.segment_bytes();
        let name = format!("quire-stage-g{}", self.group);
        let offloaded = self.host.offload(name, false, move || {
            let begun = match staged {
                Some(s) => Ok(s),
                None => {
                    StagedImage::begin(dir, &chunk.snapshot, chunk.total, numbers, segment_bytes)
                }
            };
            let mut st = match begun {
                Ok(s) => s,
                Err(e) => return (None, Err(StageError::Failed(e))),
            };
            let r = stage_chunk(&mut st, &chunk);
            (Some(st), r)
        });
        match offloaded {
            Ok(done) => self.stage_job = Some(StageJob { index, term, done }),
            Err(_) => self.raft.image_abandon(),
        }
    }

    /// Reports a staged chunk to Raft (which acknowledges it, or installs
    /// the snapshot once the image is complete).
    pub(super) fn poll_stage(&mut self) {
        if let Some(job) = &mut self.stage_job {
            let (index, term) = (job.index, job.term);
            let (staged, result) = match job.done.try_take() {
                JobState::Running => return,
                JobState::Lost => (
                    None,
                    Err(StageError::Failed(WalError::Invalid("lost".into()))),
                ),
                JobState::Done(r) => r,
            };
            self.stage_job = None;
            match result {
                Ok(whole) => {
                    let held = staged.as_ref().map_or(0, |s| s.head.held);
                    self.staged = staged;
                    self.snapshot_stats.image_chunks_staged += 1;
                    self.raft.image_stored(index, term, held, whole);
                }
                Err(e) => {
                    let why = match &e {
                        StageError::Refused(why) => why.clone(),
                        StageError::Failed(e) => e.to_string(),
                    };
                    log_warn!(
                        "group {}: staging an image of the snapshot at {index}: {why}",
                        self.group
                    );
                    drop(staged);
                    self.discard_staged();
                    match e {
                        StageError::Refused(_) => self.raft.image_refused(index, term),
                        StageError::Failed(_) => self.raft.image_abandon(),
                    }
                }
            }
        }
    }

    /// Drops a staged image the log caught up past (a new leader's
    /// appends): run after the Ready loop, which adopts one Raft just
    /// installed (its commit is then past it too).
    pub(super) fn drop_overtaken_stage(&mut self) {
        let passed = self
            .staged
            .as_ref()
            .is_some_and(|s| s.head.index <= self.raft.commit_index());
        if passed && self.stage_job.is_none() {
            self.staged = None;
            self.discard_staged();
            self.raft.image_abandon();
        }
    }

    /// Drops the staged image: its files are renamed aside at once
    /// (the next image staged is never caught by their removal) and
    /// unlinked on a helper thread (gigabytes to unlink).
    pub(super) fn discard_staged(&mut self) {
        let dropped = match drop_staged(self.wal.dir()) {
            Ok(d) => d,
            Err(e) => {
                log_warn!("group {}: dropping a staged image: {e}", self.group);
                return;
            }
        };
        if dropped.is_empty() {
            return;
        }
        let dir = self.wal.dir().clone();
        let name = format!("quire-unstage-g{}", self.group);
        let job = move || remove_dropped(&dir, &dropped);
        // Without a thread it is left for the next image's start.
        let _ = self.host.offload(name, true, job);
    }

    /// At start: an image staged before a restart goes on where it was.
    pub(crate) fn resume_staged(&mut self) {
        let dir = self.wal.dir().clone();
        let staged = match StagedImage::resume(dir, self.wal.segment_bytes()) {
            Ok(s) => s,
            Err(e) => {
                log_warn!("group {}: reading a staged image: {e}", self.group);
                None
            }
        };
        let Some(st) = staged else {
            return;
        };
        let mut st = st;
        let whole = st.complete();
        let data = if whole {
            // The state, after the header (a whole image has one).
            let mut meta = std::mem::take(&mut st.meta);
            meta.drain(..(IMAGE_HEADER_BYTES as usize).min(meta.len()));
            meta
        } else {
            Vec::new()
        };
        let h = &st.head;
        let snapshot = crate::consensus::Snapshot {
            index: h.index,
            term: h.term,
            membership: h.membership.clone(),
            data,
        };
        self.raft.resume_image(snapshot, h.total, h.held);
        let installing = whole && self.raft.snapshot().is_some_and(|s| s.index == h.index);
        if installing || self.raft.image_receiving().is_some() {
            self.snapshot_stats.images_resumed += 1;
            self.snapshot_stats.image_resumed_at = st.head.held;
            self.staged = Some(st);
        } else {
            drop(st);
            self.discard_staged();
        }
    }
}

/// Stages one chunk into `st`: `Ok(Some(data))` once the image is whole.
fn stage_chunk<D: LogDir>(
    st: &mut StagedImage<D>,
    chunk: &ImageChunk,
) -> Result<Option<Vec<u8>>, StageError> {
    let refuse = |why: &str| Err(StageError::Refused(why.to_string()));
    let (offset, data) = (chunk.offset, &chunk.snapshot.data);
    if offset != st.head.held {
        return refuse("a chunk out of order");
    }
    if st.head.total < IMAGE_HEADER_BYTES {
        return refuse("an image shorter than its header");
    }
    let index = st.head.index;
    let header = ImageHeader::decode(&st.meta, index);
    let in_meta = header.is_none_or(|h| offset < h.meta_end());
    if in_meta {
        let len = data.len() as u64;
        let after = st.meta.len() as u64 + len;
        let header = header.or_else(|| {
            let mut head = st.meta.clone();
            head.extend_from_slice(
                data.get(..36usize.saturating_sub(st.meta.len()))
                    .unwrap_or(data),
            );
            ImageHeader::decode(&head, index)
        });
        let fits = match header {
            Some(h) => after <= h.meta_end() && h.total() == st.head.total,
            None => after < IMAGE_HEADER_BYTES,
        };
        if len == 0 || !fits {
            return refuse("a header or state chunk that does not fit the image");
        }
        st.add_meta(data, offset + len)
            .map_err(StageError::Failed)?;
    } else {
        let h = header.expect("checked above");
        let Some(first) = h.entry_at(offset) else {
            return refuse("entries past the image's end");
        };
        let Some(entries) = decode_entries(data, first, index) else {
            return refuse("a chunk of entries that does not decode");
        };
        let held = offset + entries.len() as u64;
        st.add_entries(first, &entries, held)
            .map_err(StageError::Failed)?;
    }
    if !st.complete() {
        return Ok(None);
    }
    // Complete: the header decoded (a chunk past it needs it), and the
    // state is what follows it. The staged meta is not needed any more.
    let mut meta = std::mem::take(&mut st.meta);
    meta.drain(..(IMAGE_HEADER_BYTES as usize).min(meta.len()));
    Ok(Some(meta))
}
