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
mod tests {
    use super::*;
    use crate::consensus::{Payload, Term};
    use crate::storage::format::{BatchBuilder, Placement};

    const SEG: usize = 16 * BLOCK_BYTES;

    /// Lays batches out like the writer: consecutive, rolling to the next
    /// segment when one does not fit. Each batch: (first index, count, term).
    fn layout(batches: &[(Index, u64, Term)]) -> (Vec<Vec<u8>>, Vec<(usize, usize)>) {
        layout_committing(batches, &|_, last| last)
    }

    /// `layout`, with each batch's commit from `commit(seq, last index)`.
    fn layout_committing(
        batches: &[(Index, u64, Term)],
        commit: &dyn Fn(usize, Index) -> Index,
    ) -> (Vec<Vec<u8>>, Vec<(usize, usize)>) {
        let mut segs = vec![vec![0u8; SEG]];
        let mut at = 0;
        let mut places = Vec::new();
        for (seq, &(first, count, term)) in batches.iter().enumerate() {
            let mut b = BatchBuilder::new(first);
            for i in 0..count {
                b.push(&Entry {
                    term,
                    index: first + i,
                    payload: Payload::Normal(vec![(first + i) as u8; 700].into()),
                });
            }
            if at + b.disk_bytes() > SEG {
                segs.push(vec![0u8; SEG]);
                at = 0;
            }
            let s = segs.len() - 1;
            let place = Placement {
                segment: s as u64,
                recycled: false,
            };
            let bytes = b
                .finish(seq as u64 + 1, commit(seq, first + count - 1), place)
                .as_slice()
                .to_vec();
            segs[s][at..at + bytes.len()].copy_from_slice(&bytes);
            places.push((s, at));
            at += bytes.len();
        }
        (segs, places)
    }

    fn run(segs: &[Vec<u8>], window: u64) -> ScanResult {
        run_from(segs, 0, window)
    }

    /// Scans with the log starting after `base` (a snapshot or trim point).
    fn run_from(segs: &[Vec<u8>], base: Index, window: u64) -> ScanResult {
        scan_with(segs, base, base, window, 0)
    }

    /// Scans segment images numbered from 0, with every input of `scan`.
    fn scan_with(
        segs: &[Vec<u8>],
        base: Index,
        commit: Index,
        window: u64,
        life_start: u64,
    ) -> ScanResult {
        let images = segs.iter().enumerate().map(|(i, b)| SegmentImage {
            id: i as u64,
            bytes: b.clone(),
        });
        scan(images, base, commit, window, life_start)
    }

    fn indexes(r: &ScanResult) -> Vec<(Index, Term)> {
        r.entries.iter().map(|e| (e.index, e.term)).collect()
    }

    fn ten_batches() -> Vec<(Index, u64, Term)> {
        (0..10).map(|i| (1 + i * 10, 10, 1)).collect()
    }

    #[test]
    fn clean_log_across_segments() {
        let (segs, _) = layout(&ten_batches());
        assert!(segs.len() > 1, "the test wants several segments");
        let r = run(&segs, 1);
        assert_eq!(r.entries.len(), 100);
        assert!(r.torn_tail.is_none() && r.corruption.is_empty());
        assert_eq!(r.commit, 100);
        assert_eq!(r.last_seq, 10);
    }

    #[test]
    fn torn_last_batch_is_discarded() {
        let (mut segs, places) = layout(&ten_batches());
        let (s, at) = places[9];
        segs[s][at + 3000] ^= 0x40;
        let r = run(&segs, 1);
        assert_eq!(r.entries.len(), 90);
        let t = r.torn_tail.expect("torn tail reported");
        assert_eq!((t.segment, t.offset), (s as u64, at as u64));
        assert!(r.corruption.is_empty());
        assert_eq!(r.append_at, Some((s as u64, at as u64)));
        assert_eq!(r.commit, 90, "commit from the torn batch is not trusted");
    }

    #[test]
    fn damage_in_an_earlier_life_is_corruption_whatever_the_window() {
        // Batches 1..=7 were written in an earlier life (with a window of
        // 1); this life, which started at batch 8, runs a window of 8.
        // Rot in batch 5, followed by 6..=10 (a jump of 6, inside 8),
        // would pass for a torn tail, and acknowledged entries would go.
        let (mut segs, places) = layout(&ten_batches());
        let (s, at) = places[4];
        segs[s][at + 3000] ^= 0x40;
        let torn = scan_with(&segs, 0, 0, 8, 0);
        assert!(
            torn.torn_tail.is_some(),
            "without the life start: the old rule"
        );
        let r = scan_with(&segs, 0, 0, 8, 8);
        assert!(r.torn_tail.is_none());
        assert_eq!(r.corruption.len(), 1, "{:?}", r.corruption);
        assert_eq!(r.entries.len(), 40);
        assert_eq!(r.repair_until, Some(100));
    }

    #[test]
    fn entries_past_the_commit_before_damage_are_not_trusted() {
        // Batch 2 (11..=20) recorded commit 10; the damaged batch 3 may
        // have rewritten 15.. in a new term, so the old 15..=20 may be
        // stale. The trusted log ends at 10, and everything held past it
        // is repaired; the commit recovered is not above it.
        let batches = [(1, 10, 1), (11, 10, 1), (15, 10, 2), (25, 5, 2)];
        let (mut segs, places) = layout_committing(&batches, &|seq, last| match seq {
            1 => 10,
            _ => last,
        });
        let (s, at) = places[2];
        segs[s][at + 3000] ^= 0x40;
        let r = scan_with(&segs, 0, 29, 1, 0);
        assert_eq!(r.corruption.len(), 1, "{:?}", r.corruption);
        assert_eq!(r.entries.len(), 10);
        assert_eq!(r.corruption[0].lost.0, 11);
        assert!(r.commit <= 10, "commit {}", r.commit);
        assert_eq!(r.repair_until, Some(29));
    }

    #[test]
    fn a_discarded_rewrite_gives_back_the_entries_it_replaced() {
        // Two flushes in flight rewrote the log from 2 in term 2: the
        // crash lost the first (zeros) and kept the second (from 3). It
        // is a torn tail, and the trusted 1..=5 of term 1 come back whole,
        // not mixed with the second's entry 3.
        let batches = [
            (1, 1, 1),
            (2, 1, 1),
            (3, 1, 1),
            (4, 1, 1),
            (5, 1, 1),
            (2, 1, 2),
            (3, 1, 2),
        ];
        let (mut segs, places) = layout(&batches);
        let (s, at) = places[5];
        let end = places[6].1;
        segs[s][at..end].fill(0);
        let r = run(&segs, 2);
        assert!(r.torn_tail.is_some() && r.corruption.is_empty());
        assert_eq!(indexes(&r), [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]);
    }

    #[test]
    fn commit_from_a_discarded_batch_is_not_recovered() {
        // Batch 3 is torn and batch 4, in flight with it, is discarded
        // with it: the commit it recorded (15, inside the trusted log)
        // must not be recovered, or the next recovery, after the tail is
        // zeroed, finds a lower one.
        let batches = [(1, 10, 1), (11, 10, 1), (21, 10, 1), (31, 10, 1)];
        let (mut segs, places) = layout_committing(&batches, &|seq, last| match seq {
            3 => 15,
            _ => last.min(5),
        });
        let (s, at) = places[2];
        segs[s][at + 3000] ^= 0x40;
        let r = run(&segs, 2);
        assert_eq!(r.entries.len(), 20);
        assert!(r.torn_tail.is_some() && r.corruption.is_empty());
        assert_eq!(r.commit, 5);
    }

    #[test]
    fn in_flight_window_decides_torn_or_corrupt() {
        let (mut segs, places) = layout(&ten_batches());
        let (s, at) = places[8];
        segs[s][at + 100] ^= 0x01; // batch 9 bad, batch 10 intact
        let torn = run(&segs, 2);
        assert_eq!(torn.entries.len(), 80);
        assert_eq!(
            torn.torn_tail.as_ref().map(|t| t.batches_discarded),
            Some(1)
        );
        let corrupt = run(&segs, 1);
        assert_eq!(
            corrupt.entries.len(),
            80,
            "trusted log stops before the damage"
        );
        assert_eq!(corrupt.corruption.len(), 1);
        let c = &corrupt.corruption[0];
        assert_eq!((c.segment, c.offset), (s as u64, at as u64));
        assert_eq!(c.lost, (81, 90));
        assert!(!c.healed);
        assert_eq!(corrupt.repair_until, Some(100));
        assert!(
            corrupt.torn_tail.is_none(),
            "corruption is never truncated as a tail"
        );
    }

    #[test]
    fn zeroed_block_in_the_middle_is_corruption() {
        let (mut segs, places) = layout(&ten_batches());
        let (s, at) = places[3];
        segs[s][at..at + BLOCK_BYTES].fill(0);
        let r = run(&segs, 1);
        assert_eq!(r.entries.len(), 30);
        assert_eq!(r.corruption.len(), 1);
        assert_eq!(r.corruption[0].lost, (31, 40));
        assert_eq!(r.repair_until, Some(100));
    }

    #[test]
    fn a_rewrite_from_below_heals_the_damage() {
        let mut batches = ten_batches();
        batches.push((31, 5, 2)); // a repair: from index 31 again, term 2
        let (mut segs, places) = layout(&batches);
        let (s, at) = places[3];
        segs[s][at + 50] ^= 0xff;
        let r = run(&segs, 1);
        assert_eq!(r.corruption.len(), 1);
        assert!(r.corruption[0].healed);
        let got = indexes(&r);
        assert_eq!(got.len(), 35);
        assert_eq!(got[30], (31, 2));
        // The damaged region held entries up to 100, and the rewrite stops
        // at 35: a repair a crash cut short looks just like this, so the
        // node must not vote until its log reaches 100 again.
        assert_eq!(r.repair_until, Some(100));
        // A rewrite that reaches as far as the damaged region ends it.
        let mut batches = ten_batches();
        batches.push((31, 70, 2));
        let (mut segs, places) = layout(&batches);
        let (s, at) = places[3];
        segs[s][at + 50] ^= 0xff;
        let r = run(&segs, 1);
        assert!(r.corruption[0].healed);
        assert_eq!(r.repair_until, None);
        assert_eq!(r.entries.len(), 100);
    }

    #[test]
    fn zero_segments_before_the_first_batch_are_not_damage() {
        // After a trim, the log may start at a high sequence number, with
        // leftover zeroed spares sorting before it.
        let (segs, _) = layout(&ten_batches());
        let mut all = vec![vec![0u8; SEG]];
        all.extend(segs.into_iter().skip(1));
        let r = run_from(&all, 80, 1); // the first segment was trimmed at 80
        assert!(
            r.corruption.is_empty() && r.torn_tail.is_none(),
            "{:?}",
            r.corruption
        );
        assert!(!r.entries.is_empty());
    }

    #[test]
    fn a_later_batch_truncates_the_suffix() {
        let (segs, _) = layout(&[(1, 10, 1), (11, 10, 1), (15, 3, 2)]);
        let r = run(&segs, 1);
        let got = indexes(&r);
        assert_eq!(got.len(), 17);
        assert_eq!(got[13], (14, 1));
        assert_eq!(got[14], (15, 2));
    }

    #[test]
    fn garbage_after_the_last_batch_is_a_torn_tail_to_zero() {
        let (mut segs, places) = layout(&ten_batches()[..3]);
        let (s, at) = places[2];
        let end = at + crate::storage::format::align_up(48 + 10 * (32 + 700));
        segs[s][end + BLOCK_BYTES..end + BLOCK_BYTES + 64].fill(0xab);
        let r = run(&segs, 1);
        assert_eq!(r.entries.len(), 30);
        let t = r.torn_tail.expect("garbage reported");
        assert_eq!(t.zero_until, (s as u64, (end + 2 * BLOCK_BYTES) as u64));
        assert_eq!(r.append_at, Some((s as u64, end as u64)));
    }

    /// Writes one life of a segment file: batches (first index, count,
    /// payload bytes) from offset 0 with sequence numbers from `seq`.
    /// Returns each batch's offset and the end.
    fn write_life(
        file: &mut [u8],
        segment: u64,
        recycled: bool,
        seq: u64,
        batches: &[(Index, u64, usize)],
    ) -> (Vec<usize>, usize) {
        let mut at = 0;
        let mut offsets = Vec::new();
        for (i, &(first, count, bytes)) in batches.iter().enumerate() {
            let mut b = BatchBuilder::new(first);
            for j in 0..count {
                b.push(&Entry {
                    term: 1,
                    index: first + j,
                    payload: Payload::Normal(vec![0x5a; bytes].into()),
                });
            }
            let place = Placement { segment, recycled };
            let data = b.finish(seq + i as u64, first + count - 1, place);
            file[at..at + data.len()].copy_from_slice(data.as_slice());
            offsets.push(at);
            at += data.len();
        }
        (offsets, at)
    }

    /// A file that lived as segment 2 with three-block batches, recycled
    /// as segment 7 and rewritten with two-block batches: the new life
    /// ends inside an old batch.
    fn recycled_file(new_batches: usize) -> (Vec<u8>, Vec<usize>, usize) {
        let mut file = vec![0u8; SEG];
        let old: Vec<_> = (0..5).map(|i| (1 + i * 4, 4, 2500)).collect();
        write_life(&mut file, 2, false, 1, &old);
        let new: Vec<_> = (0..new_batches as u64)
            .map(|i| (101 + i * 2, 2, 3000))
            .collect();
        let (offsets, end) = write_life(&mut file, 7, true, 50, &new);
        (file, offsets, end)
    }

    fn scan_one(file: Vec<u8>, id: u64, base: Index, window: u64) -> ScanResult {
        let images = [SegmentImage { id, bytes: file }];
        scan(images, base, base, window, 0)
    }

    #[test]
    fn a_recycled_segment_ends_where_its_new_life_ends() {
        let (file, _, end) = recycled_file(4);
        let old_batch_spans_end = (end % (3 * BLOCK_BYTES)) != 0;
        assert!(
            old_batch_spans_end,
            "the test wants the new end inside an old batch"
        );
        let r = scan_one(file, 7, 100, 2);
        assert_eq!(indexes(&r), (101..=108).map(|i| (i, 1)).collect::<Vec<_>>());
        assert!(r.torn_tail.is_none(), "{:?}", r.torn_tail);
        assert!(r.corruption.is_empty(), "{:?}", r.corruption);
        assert_eq!(r.append_at, Some((7, end as u64)));
        assert!(r.append_recycled);
        assert_eq!(r.last_seq, 53);
    }

    #[test]
    fn a_recycled_spare_holds_no_log_and_is_not_zeroed() {
        let (segs, _) = layout(&ten_batches());
        let mut all = segs.clone();
        let mut spare = vec![0u8; SEG];
        let old: Vec<_> = (0..3).map(|i| (1 + i * 4, 4, 2500)).collect();
        write_life(&mut spare, 0, false, 1, &old);
        all.push(spare);
        all.push(vec![0u8; SEG]);
        let r = run(&all, 1);
        assert_eq!(r.entries.len(), 100);
        assert!(r.torn_tail.is_none() && r.corruption.is_empty());
        let last = segs.len() as u64 - 1;
        assert_eq!(r.append_at.map(|a| a.0), Some(last));
        assert!(
            !r.zeroed_segments.contains(&(last + 1)),
            "the recycled spare is not zeroed"
        );
        assert!(r.zeroed_segments.contains(&(last + 2)));
        assert!(!r.append_recycled);
    }

    #[test]
    fn a_spare_recycled_twice_is_free_space_inside_its_older_lives() {
        // The spare's last life (as segment 7) ends inside a batch of its
        // life before (as segment 2): undecodable blocks there are old
        // data, not a torn write, after a clean shutdown.
        let (segs, _) = layout(&ten_batches());
        let (spare, _, end) = recycled_file(4);
        assert!(
            end % (3 * BLOCK_BYTES) != 0,
            "the test wants an old batch cut"
        );
        let spare_id = 9;
        let images = segs
            .iter()
            .enumerate()
            .map(|(i, b)| SegmentImage {
                id: i as u64,
                bytes: b.clone(),
            })
            .chain([SegmentImage {
                id: spare_id,
                bytes: spare,
            }]);
        let r = scan(images, 0, 0, 1, 0);
        assert_eq!(r.entries.len(), 100);
        assert!(r.torn_tail.is_none(), "{:?}", r.torn_tail);
        assert!(r.corruption.is_empty(), "{:?}", r.corruption);
        assert_eq!(r.append_at.map(|a| a.0), Some(segs.len() as u64 - 1));
        assert!(!r.zeroed_segments.contains(&spare_id));
    }

    #[test]
    fn a_torn_write_in_a_recycled_segment_is_still_a_torn_tail() {
        let (mut file, offsets, end) = recycled_file(4);
        // Batch 3 of the new life is torn; batch 4 (in flight with it) landed.
        file[offsets[2] + 100] ^= 0x10;
        let torn = scan_one(file.clone(), 7, 100, 2);
        assert_eq!(torn.entries.len(), 4);
        let t = torn.torn_tail.expect("torn tail reported");
        assert_eq!(t.batches_discarded, 1);
        assert_eq!((t.segment, t.offset), (7, offsets[2] as u64));
        assert_eq!(t.zero_until, (7, end as u64));
        assert_eq!(torn.append_at, Some((7, offsets[2] as u64)));
        // Beyond the in-flight window the same damage is corruption.
        let corrupt = scan_one(file, 7, 100, 0);
        assert_eq!(corrupt.corruption.len(), 1);
        assert_eq!(corrupt.corruption[0].lost, (105, 106));
        assert!(corrupt.torn_tail.is_none());
    }

    #[test]
    fn a_log_that_starts_late_is_missing_its_head() {
        // The first batch on disk starts above the snapshot: the batches
        // before it were lost, which is corruption, not free space.
        let (segs, _) = layout(&ten_batches());
        let mut all = vec![vec![0u8; SEG]];
        all.extend(segs.into_iter().skip(1));
        let r = run_from(&all, 40, 1);
        assert_eq!(r.corruption.len(), 1, "{:?}", r.corruption);
        assert_eq!(r.corruption[0].lost.0, 41);
        assert!(r.entries.is_empty());
    }
}
