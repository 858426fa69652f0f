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
