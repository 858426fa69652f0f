//! The recovery scan: from the bytes of a group's segments, rebuild the
//! log, telling a torn tail (never acknowledged, safe to discard) from
//! corruption in the middle (acknowledged data damaged: never truncated,
//! reported, repaired from a peer). Pure: the caller reads the files.
//!
//! The rules, with `w` = flushes that may be in flight at once:
//! - batches carry consecutive sequence numbers; a block that does not hold
//!   a valid batch is *suspect*;
//! - suspect blocks followed by nothing valid, or only by batches at most
//!   `w` sequence numbers later, are a torn tail: those batches were in
//!   flight at the crash, so none was acknowledged. They are discarded;
//! - suspect blocks followed by a batch more than `w` sequence numbers
//!   later are corruption: the damaged batches had been made durable and
//!   acknowledged before. So are suspect blocks after a batch of an
//!   earlier life (below the superblock's `life_start_seq`) followed by
//!   any batch: that life's tail was read back whole when the next one
//!   opened, and `w` may have been smaller then. Nothing is truncated; the damage is reported
//!   with its segment and offset, the trusted log ends before it, and the
//!   node must fetch the range again from a peer before it votes;
//! - a later batch that starts at or below the damaged range rewrote it
//!   (a repair, or a truncation by consensus): the damage is healed;
//! - a batch naming another segment is left from a recycled file's earlier
//!   life: free space, like zeros. In a segment whose batches carry the
//!   recycled flag, or after a batch of an earlier life, undecodable
//!   blocks are free space too (the inside of such an old batch) unless
//!   valid batches follow them;
//! - before the first batch, anything is free space (spares, or segments
//!   left from before a trim) as long as that batch starts the log where
//!   the snapshot ends; if it starts later, what is missing is corruption.

use super::format::{decode_batch, FormatError, BLOCK_BYTES};
use crate::consensus::{Entry, Index};
use std::collections::BTreeSet;

/// A segment file's contents.
pub struct SegmentImage {
    /// Segment number (files are named after it).
    pub id: u64,
    /// The whole file.
    pub bytes: Vec<u8>,
}

/// Where a batch lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLocation {
    /// Segment number.
    pub segment: u64,
    /// Byte offset in the segment.
    pub offset: u64,
    /// Bytes on disk.
    pub disk_bytes: u64,
    /// Sequence number.
    pub seq: u64,
    /// First entry index.
    pub first_index: Index,
    /// Entries in it.
    pub count: u64,
    /// Written into a recycled segment file.
    pub recycled: bool,
}

/// Damage found in the middle of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    /// Segment holding the first damaged block.
    pub segment: u64,
    /// Its byte offset.
    pub offset: u64,
    /// What was wrong there.
    pub reason: FormatError,
    /// Index range whose entries could not be read.
    pub lost: (Index, Index),
    /// True if a later batch rewrote that range.
    pub healed: bool,
}

/// A torn tail that was discarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Segment of the first bad block.
    pub segment: u64,
    /// Its byte offset.
    pub offset: u64,
    /// What was wrong there.
    pub reason: FormatError,
    /// Valid but unacknowledgeable batches after it that were dropped.
    pub batches_discarded: u64,
    /// Where the trusted log ended, (segment, offset).
    pub zero_from: (u64, u64),
    /// End of the damaged region, (segment, offset): the caller zeroes
    /// from `zero_from` up to here before writing again, so that no
    /// stale batch can be mistaken for a new one by a later scan.
    pub zero_until: (u64, u64),
}

/// What the scan found.
#[derive(Clone, Debug, Default)]
pub struct ScanResult {
    /// Trusted entries after the snapshot, consecutive.
    pub entries: Vec<Entry>,
    /// Highest commit index recorded, capped at the trusted end.
    pub commit: Index,
    /// Every batch that contributed, in order (for the sparse index).
    pub batches: Vec<BatchLocation>,
    /// Highest batch sequence number seen.
    pub last_seq: u64,
    /// Where the next batch goes: (segment, offset).
    pub append_at: Option<(u64, u64)>,
    /// The torn tail discarded, if any.
    pub torn_tail: Option<TornTail>,
    /// Corruption found, healed or not.
    pub corruption: Vec<Corruption>,
    /// With unhealed corruption: the highest index the disk held; the
    /// node must not vote until its log is durable up to here again.
    pub repair_until: Option<Index>,
    /// Segments holding nothing but zeros (never written since they were
    /// zero-filled); every other segment may hold old batches.
    pub zeroed_segments: BTreeSet<u64>,
    /// Whether the segment at `append_at` is a recycled file (true when
    /// unknown).
    pub append_recycled: bool,
}

#[derive(Clone)]
struct Suspect {
    segment: u64,
    offset: u64,
    reason: FormatError,
    trusted_len: usize,
    seq: u64,
    /// The commit the trusted log recorded (batches after it may be
    /// discarded with their commits).
    commit: Index,
    /// The highest commit the trusted log's own batches recorded (not the
    /// superblock's): entries up to it were committed when the damaged
    /// batch was written, so it cannot have rewritten them.
    batch_commit: Index,
    batches_before: usize,
    /// Where the trusted log ended: appends continue, and zeroing starts, here.
    start: (u64, u64),
    /// End of the last non-zero block or batch seen since, if any.
    dirty_until: Option<(u64, u64)>,
    /// The trusted entries from `replaced_from` to `trusted_len` that a
    /// batch applied tentatively since replaced (a rewrite): put back if
    /// the suspect turns out to be a torn tail or damage.
    replaced_from: usize,
    replaced: Vec<Entry>,
}

impl Suspect {
    /// Keeps the trusted entries a tentative batch applied from `keep`
    /// is about to replace.
    fn save_before_apply(&mut self, log: &[Entry], keep: usize) {
        let keep = keep.min(log.len());
        if keep < self.replaced_from {
            // Below `replaced_from` the log is still the trusted one.
            let mut head = log[keep..self.replaced_from].to_vec();
            head.append(&mut self.replaced);
            self.replaced = head;
            self.replaced_from = keep;
        }
    }

    /// Puts the trusted log back as it was when this suspect was noted.
    fn restore(&mut self, log: &mut Vec<Entry>) {
        log.truncate(self.replaced_from.min(log.len()));
        log.append(&mut self.replaced);
        log.truncate(self.trusted_len);
    }
}

/// Rebuilds the log from segments in order. `base` is the index the log
/// starts after (the snapshot's); `commit` the superblock's; `window` the
/// number of flushes that may have been in flight; `life_start` the
/// sequence number the log's last life started at (0: unknown).
///
/// Segments are taken one at a time, so a caller that reads each file
/// lazily holds one segment in memory, not the whole log.
pub fn scan(
    segments: impl IntoIterator<Item = SegmentImage>,
    base: Index,
    commit: Index,
    window: u64,
    life_start: u64,
) -> ScanResult {
    let mut r = ScanResult {
        commit,
        ..ScanResult::default()
    };
    let mut log: Vec<Entry> = Vec::new();
    let mut suspect: Option<Suspect> = None;
    // Unhealed damage: trusted log end and the highest index seen since.
    let mut hole: Option<usize> = None;
    // The highest commit a batch applied so far recorded.
    let mut batch_commit: Index = 0;
    let trusted_end = |log: &Vec<Entry>| base + log.len() as u64;

    for seg in segments {
        let mut off = 0usize;
        // This segment's current life is in a recycled file.
        let mut recycled = false;
        // Holds a batch of an earlier life (naming another segment).
        let mut old_life = false;
        let mut only_zeros = true;
        while off + BLOCK_BYTES <= seg.bytes.len() {
            let batch = match decode_batch(&seg.bytes[off..]) {
                Ok(b) if b.place.segment != seg.id => {
                    only_zeros = false;
                    old_life = true;
                    let reason = FormatError::Recycled;
                    note_suspect(
                        &mut suspect,
                        batch_commit,
                        seg.id,
                        off,
                        reason,
                        false,
                        &log,
                        &r,
                    );
                    off += b.disk_bytes;
                    continue;
                }
                Ok(b) if r.last_seq == 0 || b.seq > r.last_seq => b,
                Ok(_) => {
                    // A batch older than one already applied cannot be
                    // here unless something wrote where it should not.
                    only_zeros = false;
                    let reason = FormatError::BadField;
                    note_suspect(
                        &mut suspect,
                        batch_commit,
                        seg.id,
                        off,
                        reason,
                        true,
                        &log,
                        &r,
                    );
                    off += BLOCK_BYTES;
                    continue;
                }
                Err(e) => {
                    only_zeros &= e == FormatError::Zeroed;
                    // In a recycled file an undecodable block is most
                    // likely the inside of an older life's batch.
                    let dirty = e != FormatError::Zeroed && !recycled && !old_life;
                    note_suspect(&mut suspect, batch_commit, seg.id, off, e, dirty, &log, &r);
                    off += BLOCK_BYTES;
                    continue;
                }
            };
            only_zeros = false;
            recycled = batch.place.recycled;
            if r.batches.is_empty() && batch.first_index <= base + 1 {
                // Whatever came before the first batch (spares, segments
                // left from before a trim or a snapshot install) held
                // nothing the log needs: free space, not damage.
                suspect = None;
            }
            if let Some(s) = suspect.as_mut() {
                s.dirty_until = Some((seg.id, (off + batch.disk_bytes) as u64));
            }
            if let Some(mut s) = suspect.take() {
                let jump = batch.seq - s.seq;
                if jump == 1 {
                    // Nothing missing: unused space at a segment's end (or
                    // stray bytes in free space) between two batches.
                    suspect = None;
                } else if jump > window || s.seq + 1 < life_start {
                    // The damaged batch may have rewritten the log's end
                    // (a truncation by a new leader): past what was
                    // committed when it was written, the trusted entries
                    // may be stale, and applying one would diverge. They
                    // count as lost too, fetched again in repair.
                    let held = base + log.len() as u64;
                    let committed = s.batch_commit.max(base) - base;
                    let certain = s.trusted_len.min(committed as usize);
                    s.restore(&mut log);
                    log.truncate(certain);
                    if held > base + certain as u64 {
                        r.repair_until = Some(r.repair_until.unwrap_or(0).max(held));
                    }
                    let start = base + certain as u64 + 1;
                    let healed = batch.first_index <= start;
                    r.corruption.push(Corruption {
                        segment: s.segment,
                        offset: s.offset,
                        reason: s.reason,
                        lost: (start, batch.first_index.max(start + 1) - 1),
                        healed,
                    });
                    if !healed && hole.is_none() {
                        hole = Some(certain);
                    }
                } else {
                    // Still ambiguous: keep the suspect and apply the batch
                    // tentatively; the end of the scan decides.
                    suspect = Some(s);
                }
            }
            let loc = BatchLocation {
                segment: seg.id,
                offset: off as u64,
                disk_bytes: batch.disk_bytes as u64,
                seq: batch.seq,
                first_index: batch.first_index,
                count: batch.entries.len() as u64,
                recycled,
            };
            r.last_seq = batch.seq;
            r.commit = r.commit.max(batch.commit);
            if let Some(trusted) = hole {
                if batch.first_index <= base + trusted as u64 + 1 {
                    hole = None; // rewritten from below the damage: healed
                    if let Some(c) = r.corruption.last_mut() {
                        c.healed = true;
                    }
                }
            }
            if hole.is_none() {
                batch_commit = batch_commit.max(batch.commit);
                if let Some(s) = suspect.as_mut() {
                    let keep = batch.first_index.saturating_sub(base + 1) as usize;
                    s.save_before_apply(&log, keep);
                }
                apply(&mut log, base, batch.first_index, batch.entries);
            } else {
                let last = batch.first_index + loc.count;
                r.repair_until = Some(r.repair_until.unwrap_or(0).max(last.saturating_sub(1)));
            }
            r.batches.push(loc);
            off += batch.disk_bytes;
            r.append_at = Some((seg.id, off as u64));
        }
        if only_zeros {
            r.zeroed_segments.insert(seg.id);
        }
    }

    if let Some(mut s) = suspect {
        // Only in-flight batches after the damage: a torn tail. Zeros
        // alone are just the preallocated end of the log.
        r.append_at = Some(s.start);
        if let Some(zero_until) = s.dirty_until {
            let discarded = r.batches.len() - s.batches_before;
            r.batches.truncate(s.batches_before);
            // A discarded batch may have rewritten trusted entries.
            s.restore(&mut log);
            r.last_seq = s.seq;
            // What a discarded batch recorded never became durable: a
            // later recovery, after the tail is zeroed, would not see it.
            r.commit = s.commit;
            r.torn_tail = Some(TornTail {
                segment: s.segment,
                offset: s.offset,
                reason: s.reason,
                batches_discarded: discarded as u64,
                zero_from: s.start,
                zero_until,
            });
        }
    }
    // A rewrite from below the damage heals the hole but may stop short of
    // what the damaged region held: a repair cut short by a crash looks
    // the same as a truncation by a new leader, and only the first must
    // keep the node from voting. So the node repairs until its log
    // reaches what it held, either way (the second only costs its vote
    // until the group's log grows past that again).
    if let Some(u) = r.repair_until {
        if u <= trusted_end(&log) {
            r.repair_until = None;
        }
    }
    r.append_recycled = r.append_at.is_none_or(|(seg, _)| {
        r.batches
            .iter()
            .rev()
            .find(|b| b.segment == seg)
            .is_none_or(|b| b.recycled)
    });
    // Commit recorded by discarded or untrusted batches is not trusted.
    r.commit = r.commit.min(trusted_end(&log)).max(base);
    r.entries = log;
    r
}

/// Records a block that holds no batch of the log. `dirty` blocks may be
/// a torn write and are zeroed with a torn tail; others are free space.
#[allow(clippy::too_many_arguments)]
fn note_suspect(
    suspect: &mut Option<Suspect>,
    batch_commit: Index,
    segment: u64,
    off: usize,
    reason: FormatError,
    dirty: bool,
    log: &[Entry],
    r: &ScanResult,
) {
    let dirty = dirty.then_some((segment, (off + BLOCK_BYTES) as u64));
    match suspect {
        None => {
            *suspect = Some(Suspect {
                segment,
                offset: off as u64,
                reason,
                trusted_len: log.len(),
                seq: r.last_seq,
                commit: r.commit,
                batch_commit,
                batches_before: r.batches.len(),
                start: (segment, off as u64),
                dirty_until: dirty,
                replaced_from: log.len(),
                replaced: Vec::new(),
            })
        }
        Some(s) => {
            if dirty.is_some() {
                if s.dirty_until.is_none() {
                    // Only zeros so far (a segment's unused end): the
                    // damage starts here, so report it here.
                    s.segment = segment;
                    s.offset = off as u64;
                    s.reason = reason;
                }
                s.dirty_until = dirty;
            }
        }
    }
}

/// Applies a batch: it replaces everything from its first index on.
fn apply(log: &mut Vec<Entry>, base: Index, first_index: Index, entries: Vec<Entry>) {
    let keep = first_index.saturating_sub(base + 1) as usize;
    if keep > log.len() {
        // A gap in indexes without a gap in sequence numbers cannot be
        // produced by the writer; keep what is trusted and stop here.
        return;
    }
    log.truncate(keep);
    log.extend(entries.into_iter().filter(|e| e.index > base));
}

#[cfg(test)]
mod tests;
