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

use super::super::host::{Host, JobState, Offloaded};
use super::super::log::log_warn;
use super::tap::{GlueBug, WorkloadBug};
use super::Replica;
use crate::consensus::Index;
use crate::storage::{LogDir, WalError};

/// A snapshot written by the helper thread: the snapshot, its bytes, and
/// the lowest log index its state refers to.
pub(super) type SnapshotWritten = (crate::consensus::Snapshot, usize, Option<Index>);

/// A snapshot image being read from the segments and encoded on a
/// helper thread, for a follower behind the trimmed log.
pub(super) struct ImageJob {
    index: Index,
    done: Box<dyn Offloaded<Result<Vec<u8>, WalError>>>,
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
                    self.set_keep_from(keep_from);
                    if let Err(e) = self.wal.adopt_snapshot(index, term, keep_from) {
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

    pub(super) fn set_keep_from(&mut self, keep_from: Option<Index>) {
        // Index 0 holds no entry, so 0 can stand for "none".
        self.snapshot_stats.retained_from = keep_from.unwrap_or(0);
    }

    /// The lowest log index the state at Raft's snapshot refers to.
    pub(super) fn keep_from(&self) -> Option<Index> {
        Some(self.snapshot_stats.retained_from).filter(|&i| i > 0)
    }

    /// Answers Raft's request for the image of the snapshot at `index`
    /// (a follower is behind the trimmed log): the entries from
    /// `keep_from()` to `index` are read from the segments (or taken from
    /// the copies repaired from peers, `repair`) and
    /// encoded with the snapshot on a helper thread, so a large backlog
    /// does not stall the loop; `poll_image` hands the image to Raft.
    pub(super) fn build_snapshot_image(&mut self, index: Index) {
        if self.image_job.as_ref().is_some_and(|j| j.index == index) {
            return;
        }
        let Some(meta) = self.raft.snapshot().filter(|s| s.index == index) else {
            return; // a newer snapshot since; asked again for that one
        };
        let meta = meta.data.clone();
        let leave_out = self.planted_workload == Some(WorkloadBug::SnapshotWithoutEntries);
        let located = match self.keep_from().filter(|_| !leave_out) {
            None => Ok(None),
            Some(from) => self
                .wal
                .locate_with_repaired(from, index)
                .map(|l| Some((from, l))),
        };
        let located = match located {
            Ok(l) => l,
            Err(e) => {
                log_warn!(
                    "group {}: locating the entries for a snapshot at {index}: {e}",
                    self.group
                );
                return;
            }
        };
        let name = format!("quire-image-g{}", self.group);
        let dir = self.wal.dir().clone();
        let offloaded = self.host.offload(name, true, move || {
            let entries = match &located {
                None => Ok(Vec::new()),
                Some((from, l)) => l.read(&dir, *from, index).and_then(|es| {
                    if es.len() as u64 == index + 1 - from {
                        Ok(es)
                    } else {
                        Err(WalError::Invalid(format!(
                            "{} of the entries {from}..={index} read",
                            es.len()
                        )))
                    }
                }),
            };
            entries.map(|es| crate::consensus::encode_image(&meta, &es))
        });
        if let Ok(done) = offloaded {
            self.image_job = Some(ImageJob { index, done });
        }
    }

    /// Hands a finished snapshot image to Raft (which drops it if its
    /// snapshot changed meanwhile, and asks again).
    pub(super) fn poll_image(&mut self) {
        let Some(job) = &mut self.image_job else {
            return;
        };
        let index = job.index;
        match job.done.try_take() {
            JobState::Running => {}
            JobState::Lost => self.image_job = None,
            JobState::Done(r) => {
                self.image_job = None;
                match r {
                    Ok(image) => self.raft.set_snapshot_image(index, image),
                    Err(e) => log_warn!(
                        "group {}: reading the entries for a snapshot at {index}: {e}",
                        self.group
                    ),
                }
            }
        }
    }
}
