//! The background scrub: reads every batch the log keeps (below the
//! snapshot and above it), at `storage.scrub_bytes_per_s`, on a helper
//! thread at low I/O priority, and checks each whole (its records'
//! checksums, and that it is the batch the index says). A damaged batch
//! below the snapshot stops being read (`Wal::distrust_batch`) and its
//! entries are repaired from peers like any found missing (`repair`);
//! one in the live log is counted and left to the next recovery, which
//! repairs it from the leader (Raft serves those entries from memory
//! meanwhile). A pass goes from the lowest batch kept to the durable end,
//! then the next starts, at least [`SCRUB_PASS_PERIOD_MIN_MS`] after this
//! one started; the status shows the last whole pass.

use super::tap::MissingFound;
use super::Replica;
use crate::consensus::Index;
use crate::node::log::{log_info, log_warn};
use crate::node::loops::host::{Host, JobState, Offloaded};
use crate::node::status::ScrubStats;
use crate::storage::{LogDir, ScrubResult};

/// Bytes one scrub read takes at most (one helper job).
const SCRUB_READ_BYTES_MAX: u64 = 4 << 20;

/// A pass starts at least this long after the previous one started (ms):
/// a small log is not read over and over, a thread a read.
pub(crate) const SCRUB_PASS_PERIOD_MIN_MS: u64 = 10_000;

/// What the scrub of one replica's log is doing and has done.
#[derive(Default)]
pub(super) struct Scrub {
    /// Bytes it may read now, and when (loop ms) that was reckoned;
    /// below zero after a batch larger than a read (a debt the rate
    /// pays off before the next read).
    budget_bytes: i64,
    budget_at_ms: Option<u64>,
    /// The next index to check from (0: a pass starts).
    cursor: Index,
    /// When the pass under way started (loop ms).
    pass_started_ms: Option<u64>,
    /// The read under way, and the index after its last batch.
    job: Option<(Box<dyn Offloaded<ScrubResult>>, Index)>,
    /// Counts, for the status.
    pub(super) stats: ScrubStats,
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Sets the scrub's rate (bytes/s; 0: off).
    pub(crate) fn set_scrub_rate(&mut self, bytes_per_s: u64) {
        self.scrub.stats.bytes_per_s = bytes_per_s;
    }

    /// One turn of the scrub (from `drive`): takes a finished read's
    /// findings, and starts the next read once the rate allows it.
    pub(super) fn drive_scrub(&mut self, now_ms: u64) {
        let rate = self.scrub.stats.bytes_per_s;
        if rate == 0 {
            return;
        }
        if let Some(end) = self.scrub.stats.last_pass_end_ms {
            self.scrub.stats.last_pass_age_ms = Some(now_ms.saturating_sub(end));
        }
        let s = &mut self.scrub;
        let at = *s.budget_at_ms.get_or_insert(now_ms);
        let earned = rate.saturating_mul(now_ms.saturating_sub(at)) / 1000;
        // The clock moves on only with what it earned: at a low rate and
        // a turn a millisecond, each turn's share would round to nothing.
        if earned > 0 {
            s.budget_at_ms = Some(now_ms);
            // Saved up: a second's worth at most (the rate is a ceiling,
            // not an average to catch up on); that always holds a read.
            let cap = i64::try_from(rate).unwrap_or(i64::MAX);
            let earned = i64::try_from(earned).unwrap_or(i64::MAX);
            s.budget_bytes = s.budget_bytes.saturating_add(earned).min(cap);
        }
        if let Some((job, _)) = &mut s.job {
            match job.try_take() {
                JobState::Running => return,
                JobState::Lost => s.job = None,
                JobState::Done(r) => {
                    let (_, next) = s.job.take().expect("a job");
                    self.take_scrub(r, next);
                }
            }
        }
        self.start_scrub_read(now_ms);
    }

    /// Starts the next read once it is due and the rate allows a whole
    /// one. It decides before it locates anything: the loop turns up to
    /// a thousand times a second, and locating a read's batches costs a
    /// walk of the index (thousands of batches for a 4 MiB read).
    fn start_scrub_read(&mut self, now_ms: u64) {
        let s = &mut self.scrub;
        if s.job.is_some() {
            return;
        }
        if s.cursor == 0 {
            let due = s
                .pass_started_ms
                .map_or(0, |t| t.saturating_add(SCRUB_PASS_PERIOD_MIN_MS));
            if now_ms < due {
                return;
            }
        }
        // A read waits for a whole read's budget (or the rate's second,
        // if smaller), so it is located once per read, not per turn.
        let read_bytes = s.stats.bytes_per_s.min(SCRUB_READ_BYTES_MAX);
        if s.budget_bytes < i64::try_from(read_bytes).unwrap_or(i64::MAX) {
            return;
        }
        let batches = self.wal.batches_from(s.cursor, read_bytes);
        let Some(last) = batches.last() else {
            // Past the durable end: a pass is whole.
            if s.cursor > 0 {
                s.stats.passes += 1;
                s.stats.last_pass_end_ms = Some(now_ms);
                s.stats.last_pass_age_ms = Some(0);
                s.stats.last_pass_ms = now_ms.saturating_sub(s.pass_started_ms.unwrap_or(now_ms));
                s.cursor = 0;
            }
            return;
        };
        let next = last.first_index + last.count.max(1);
        // One batch larger than a read goes as a read of its own (it
        // must not stop the pass), and puts the budget in debt: the
        // rate holds over time.
        let bytes: u64 = batches.iter().map(|l| l.disk_bytes).sum();
        let dir = self.wal.dir().clone();
        let name = format!("quire-scrub-g{}", self.group);
        let job = self.host.offload(name, true, move || {
            crate::storage::scrub_located(&dir, &batches)
        });
        // A job that could not start is tried again next turn.
        if let Ok(job) = job {
            let s = &mut self.scrub;
            if s.cursor == 0 {
                s.pass_started_ms = Some(now_ms);
            }
            s.budget_bytes = s
                .budget_bytes
                .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
            s.job = Some((job, next));
        }
    }

    /// Takes what a scrub read found: damaged batches below the snapshot
    /// are distrusted and their entries repaired from peers.
    fn take_scrub(&mut self, r: ScrubResult, next: Index) {
        let s = &mut self.scrub;
        s.stats.bytes_verified += r.bytes;
        s.stats.batches_verified += r.good_batches;
        s.cursor = next;
        let mut missing = Vec::new();
        for (loc, why) in r.damaged {
            // Trimmed or replaced since it was located: nothing to say.
            if !self.wal.still_indexed(&loc) {
                continue;
            }
            self.scrub.stats.damaged_batches += 1;
            let entries = loc.first_index..loc.first_index + loc.count;
            if self.wal.distrust_batch(&loc) {
                log_warn!(
                    "group {}: the scrub found the batch of entries {}..={} below the snapshot damaged ({why}): repairing what it held from a peer",
                    self.group,
                    entries.start,
                    entries.end.saturating_sub(1)
                );
                missing.extend(entries);
            } else {
                log_warn!(
                    "group {}: the scrub found the batch of entries {}..={} in the live log damaged ({why}): Raft serves them from memory; the next start's recovery repairs them from the leader",
                    self.group,
                    entries.start,
                    entries.end.saturating_sub(1)
                );
            }
        }
        if missing.is_empty() {
            return;
        }
        // Of what the batch held: what the state refers to, and the rest
        // of the range a snapshot image carries.
        let from = self.keep_from().unwrap_or(Index::MAX);
        let mut referenced = std::collections::BTreeSet::new();
        self.machine.each_stored(&mut |i| {
            referenced.insert(i);
        });
        let (refs, gaps): (Vec<Index>, Vec<Index>) = missing
            .into_iter()
            .filter(|&i| i >= from || referenced.contains(&i))
            .partition(|i| referenced.contains(i));
        log_info!(
            "group {}: the scrub sends {} referenced and {} other entries to repair",
            self.group,
            refs.len(),
            gaps.len()
        );
        self.note_missing(refs, MissingFound::Scrub, true);
        self.note_missing(gaps, MissingFound::Scrub, false);
    }

    /// The scrub's counts, for the status.
    pub(crate) fn scrub_stats(&self) -> ScrubStats {
        self.scrub.stats
    }
}
