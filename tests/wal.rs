//! The write-ahead log on real files, run against both I/O backends: every
//! test is instantiated once for io_uring and once for the portable one.

use quire::consensus::{Entry, HardState, Index, Membership, Payload, Snapshot, Term};
use quire::io::BackendChoice;
use quire::storage::{DiskState, Wal, WalConfig};
use std::path::Path;

fn cfg(backend: BackendChoice) -> WalConfig {
    WalConfig {
        segment_bytes: 256 << 10,
        flush_bytes_max: 32 << 10,
        backend,
        ..WalConfig::default()
    }
}

fn entry(index: Index, term: Term) -> Entry {
    Entry {
        term,
        index,
        payload: Payload::Normal(
            format!("record {index} of term {term} {}", "x".repeat(900))
                .into_bytes()
                .into(),
        ),
    }
}

fn open(dir: &Path, backend: BackendChoice) -> (Wal, quire::storage::OpenReport) {
    Wal::open(dir, cfg(backend)).expect("opens")
}

fn append_range(wal: &mut Wal, lo: Index, hi: Index, term: Term) {
    let entries: Vec<Entry> = (lo..=hi).map(|i| entry(i, term)).collect();
    for chunk in entries.chunks(7) {
        wal.append(None, chunk).expect("append");
        wal.poll().expect("poll");
    }
}

fn backend_is_live(b: BackendChoice) -> bool {
    if b == BackendChoice::IoUring && quire::io::uring::UringBackend::new(8).is_err() {
        println!("skipping io_uring: it cannot be set up on this machine");
        return false;
    }
    true
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod io_uring_backend {
            $(#[test] fn $name() { if super::backend_is_live(quire::io::BackendChoice::IoUring) { super::$name(quire::io::BackendChoice::IoUring) } })*
        }
        mod portable_backend {
            $(#[test] fn $name() { super::$name(quire::io::BackendChoice::Portable) })*
        }
    };
}

both_backends!(
    roundtrip_across_segments_and_reopen,
    group_commit_batches_many_records_per_flush,
    truncation_replaces_the_suffix_durably,
    hard_state_survives_reopen,
    flipped_byte_in_the_middle_is_reported_never_truncated,
    torn_tail_is_discarded_and_zeroed,
    compaction_trims_segments_and_install_replaces_the_log,
    trimmed_segments_are_recycled_instead_of_zero_filled,
    backend_in_use_is_the_one_asked_for,
    entries_the_state_refers_to_stay_below_the_snapshot,
    snapshots_take_two_slots_in_turn,
    entries_larger_than_a_flush_are_written_and_oversized_ones_refused,
);

/// An entry larger than `flush_bytes_max` takes a batch of its own (it
/// stopped the log before); one larger than `entry_bytes_max` (half a
/// segment) is refused with nothing queued, and the log goes on.
fn entries_larger_than_a_flush_are_written_and_oversized_ones_refused(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    let c = cfg(b);
    assert_eq!(wal.entry_bytes_max(), (c.segment_bytes / 2) as usize);
    let big = |index: Index, bytes: usize| Entry {
        term: 1,
        index,
        payload: Payload::Normal(vec![index as u8; bytes].into()),
    };
    append_range(&mut wal, 1, 3, 1);
    // Three times flush_bytes_max, then small ones behind it.
    let large = big(4, 3 * c.flush_bytes_max);
    wal.append(None, std::slice::from_ref(&large))
        .expect("a large entry is taken");
    append_range(&mut wal, 5, 9, 1);
    let too_big = big(10, wal.entry_bytes_max());
    let err = wal
        .append(None, &[too_big])
        .expect_err("past entry_bytes_max");
    assert!(err.to_string().contains("entry_bytes_max"), "{err}");
    wal.sync().expect("the log is not stopped");
    assert_eq!(wal.state(), &DiskState::Healthy);
    assert_eq!(wal.durable(), (9, 1));
    drop(wal);
    let (mut wal, report) = open(dir.path(), b);
    assert!(report.corruption.is_empty() && report.torn_tail.is_none());
    assert_eq!(wal.read(4, 4).unwrap(), vec![large]);
    assert_eq!(wal.read(9, 9).unwrap(), vec![entry(9, 1)]);
}

fn roundtrip_across_segments_and_reopen(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, report) = open(dir.path(), b);
    assert!(report.restored.entries.is_empty());
    append_range(&mut wal, 1, 600, 1);
    wal.sync().unwrap();
    assert_eq!(wal.durable(), (600, 1));
    let got = wal.read(250, 260).unwrap();
    assert_eq!(got, (250..=260).map(|i| entry(i, 1)).collect::<Vec<_>>());
    drop(wal);
    let (mut wal, report) = open(dir.path(), b);
    assert!(
        report.segments > 2,
        "600 KiB of records span several 256 KiB segments"
    );
    assert_eq!(report.restored.entries.len(), 600);
    assert!(report.torn_tail.is_none() && report.corruption.is_empty());
    assert_eq!(report.restored.entries[599], entry(600, 1));
    assert_eq!(
        wal.read(1, 3).unwrap(),
        vec![entry(1, 1), entry(2, 1), entry(3, 1)]
    );
    // Appends continue where the log ended.
    append_range(&mut wal, 601, 610, 1);
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    assert_eq!(report.restored.entries.len(), 610);
}

fn group_commit_batches_many_records_per_flush(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    // 256 records queued while flushes are in flight: they must share
    // flushes rather than each paying for its own fdatasync.
    for i in 1..=256 {
        wal.append(None, &[entry(i, 1)]).unwrap();
        wal.poll().unwrap();
    }
    wal.sync().unwrap();
    let m = wal.metrics();
    assert_eq!(m.records, 256);
    assert!(
        m.flushes < 128,
        "{} flushes for 256 records: no group commit",
        m.flushes
    );
    assert!(m.records_per_flush.max() > 1);
    assert!(m.flush_latency_us.len() == m.flushes);
}

fn truncation_replaces_the_suffix_durably(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 50, 1);
    wal.sync().unwrap();
    // A new leader's entries conflict from index 41 on.
    let replacement: Vec<Entry> = (41..=45).map(|i| entry(i, 2)).collect();
    wal.append(Some(41), &replacement).unwrap();
    wal.sync().unwrap();
    assert_eq!(wal.durable(), (45, 2));
    assert_eq!(wal.read(39, 45).unwrap()[2], entry(41, 2));
    assert!(
        wal.read(46, 46).unwrap().is_empty(),
        "nothing beyond the new end"
    );
    drop(wal);
    let (_, report) = open(dir.path(), b);
    let e = &report.restored.entries;
    assert_eq!(e.len(), 45);
    assert_eq!(e[39], entry(40, 1));
    assert_eq!(e[40], entry(41, 2));
    assert_eq!(e[44], entry(45, 2));
}

fn hard_state_survives_reopen(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 10, 3);
    let t = wal
        .set_hard_state(HardState {
            term: 3,
            vote: Some(2),
            commit: 8,
        })
        .unwrap();
    wal.sync().unwrap();
    assert!(wal.durable_ticket() >= t);
    // A vote alone (no entries) is flushed too.
    wal.set_hard_state(HardState {
        term: 4,
        vote: Some(3),
        commit: 9,
    })
    .unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    let hs = report.restored.hard_state;
    assert_eq!((hs.term, hs.vote), (4, Some(3)));
    assert!(hs.commit >= 8, "commit {} went backwards", hs.commit);
}

fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn flipped_byte_in_the_middle_is_reported_never_truncated(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 600, 1);
    wal.sync().unwrap();
    drop(wal);
    let segs = segment_files(dir.path());
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[5000] ^= 0x20;
    std::fs::write(victim, &bytes).unwrap();
    let before: Vec<Vec<u8>> = segs.iter().map(|p| std::fs::read(p).unwrap()).collect();

    let (_, report) = open(dir.path(), b);
    assert_eq!(report.corruption.len(), 1, "{report}");
    let c = &report.corruption[0];
    assert_eq!(c.segment, 2, "reported in the second segment");
    assert!(
        c.offset <= 5000 && c.offset % 4096 == 0,
        "at the batch holding byte 5000: {}",
        c.offset
    );
    assert!(!c.healed);
    assert!(report.torn_tail.is_none(), "corruption is not a torn tail");
    assert_eq!(report.restored.repair_until, Some(600));
    let last_trusted = report.restored.entries.last().map_or(0, |e| e.index);
    assert!(
        last_trusted < c.lost.0,
        "trusted log ends before the damage"
    );
    let expected = format!("CORRUPTION at segment 2 offset {}", c.offset);
    assert!(report.to_string().contains(&expected), "{report}");
    let after: Vec<Vec<u8>> = segs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(
        before == after,
        "recovery must not change a byte of a corrupt log"
    );
}

fn torn_tail_is_discarded_and_zeroed(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 40, 1);
    wal.sync().unwrap();
    drop(wal);
    // Tear the last batch: damage a byte near the end of the written data.
    // The last segment holding data (preallocated spares follow it).
    let segs = segment_files(dir.path());
    let last = segs
        .iter()
        .rev()
        .find(|p| std::fs::read(p).unwrap().iter().any(|&x| x != 0))
        .unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    let end = bytes.iter().rposition(|&x| x != 0).unwrap();
    bytes[end - 10] ^= 0x01;
    std::fs::write(last, &bytes).unwrap();

    let (mut wal, report) = open(dir.path(), b);
    let t = report.torn_tail.as_ref().expect("torn tail found");
    assert!(report.corruption.is_empty());
    let n = report.restored.entries.len() as u64;
    assert!(n < 40 && n > 0);
    assert!(
        report.to_string().contains("discarded a torn tail"),
        "{report}"
    );
    // Reported where it is: in the file we damaged, by its checksum, with
    // nothing valid after it (no in-flight batch was discarded with it).
    let damaged_id = u64::from_str_radix(last.file_stem().unwrap().to_str().unwrap(), 16).unwrap();
    assert_eq!(t.segment, damaged_id);
    assert!(
        (t.offset as usize) < end,
        "reported at {} past the damage at {end}",
        t.offset
    );
    assert_eq!(t.reason, quire::storage::format::FormatError::BadChecksum);
    assert_eq!(t.batches_discarded, 0);
    // Appending after the discarded tail works, and the next open is clean.
    append_range(&mut wal, n + 1, n + 5, 2);
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    assert!(
        report.torn_tail.is_none(),
        "the torn bytes were zeroed: {report}"
    );
    assert_eq!(report.restored.entries.len() as u64, n + 5);
}

fn compaction_trims_segments_and_install_replaces_the_log(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let no_recycling = WalConfig {
        segments_recycled_max: 0,
        ..cfg(b)
    };
    let (mut wal, _) = Wal::open(dir.path(), no_recycling).unwrap();
    append_range(&mut wal, 1, 800, 1);
    wal.sync().unwrap();
    let before = segment_files(dir.path()).len();
    let snap = Snapshot {
        index: 600,
        term: 1,
        membership: Membership::with_voters([1, 2, 3]),
        data: b"state at 600".to_vec(),
    };
    wal.compact(&snap).unwrap();
    let after = segment_files(dir.path()).len();
    assert!(
        after < before,
        "whole segments below 600 are deleted ({before} -> {after})"
    );
    drop(wal);
    let (mut wal, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot.as_ref(), Some(&snap));
    let first = report.restored.entries.first().unwrap().index;
    assert_eq!(first, 601, "entries resume right after the snapshot");
    assert_eq!(report.restored.entries.last().unwrap().index, 800);

    // A leader's snapshot far ahead replaces the whole log.
    let ahead = Snapshot {
        index: 5000,
        term: 4,
        membership: Membership::with_voters([1, 2, 3]),
        data: b"state at 5000".to_vec(),
    };
    wal.install_snapshot(&ahead, &[]).unwrap();
    append_range(&mut wal, 5001, 5003, 4);
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot.as_ref(), Some(&ahead));
    let idx: Vec<Index> = report.restored.entries.iter().map(|e| e.index).collect();
    assert_eq!(idx, vec![5001, 5002, 5003]);
}

fn trimmed_segments_are_recycled_instead_of_zero_filled(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    let compact_at = |wal: &mut Wal, index: Index| {
        let snap = Snapshot {
            index,
            term: 1,
            membership: Membership::with_voters([1, 2, 3]),
            data: Vec::new(),
        };
        wal.compact(&snap).unwrap();
    };
    append_range(&mut wal, 1, 800, 1);
    wal.sync().unwrap();
    compact_at(&mut wal, 600);
    let recycled = wal.metrics().segments_recycled;
    assert!(recycled > 0, "segments below 600 are kept for reuse");
    let zero_filled = wal.metrics().segments_zero_filled;
    // Four times the space on disk, compacting as a node that snapshots.
    let mut hi = 800;
    while hi < 2000 {
        append_range(&mut wal, hi + 1, hi + 100, 1);
        hi += 100;
        wal.sync().unwrap();
        compact_at(&mut wal, hi - 150);
    }
    assert_eq!(
        wal.metrics().segments_zero_filled,
        zero_filled,
        "steady state writes into recycled segments only"
    );
    assert!(wal.metrics().segments_recycled > recycled + 2);
    drop(wal);
    let (wal, report) = open(dir.path(), b);
    assert!(report.torn_tail.is_none(), "{report}");
    assert!(report.corruption.is_empty(), "{report}");
    let idx: Vec<Index> = report.restored.entries.iter().map(|e| e.index).collect();
    assert_eq!(idx, (1851..=2000).collect::<Vec<_>>());
    for e in &report.restored.entries {
        assert_eq!(e, &entry(e.index, 1));
    }
    drop(wal);
    // Appends resume after the reopen, into the recycled spares found on
    // disk (their old batches must not be mistaken for new ones).
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 2001, 2600, 1);
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    let idx: Vec<Index> = report.restored.entries.iter().map(|e| e.index).collect();
    assert_eq!(idx, (1851..=2600).collect::<Vec<_>>());
    assert!(
        report.torn_tail.is_none() && report.corruption.is_empty(),
        "{report}"
    );
}

fn backend_in_use_is_the_one_asked_for(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, report) = open(dir.path(), b);
    let want = match b {
        BackendChoice::IoUring => "io_uring",
        _ => "portable",
    };
    assert_eq!(wal.backend_name(), want);
    assert!(report.backend.contains(want), "{}", report.backend);
    assert_eq!(*wal.state(), DiskState::Healthy);
}

/// Adopting a snapshot keeps every segment from the oldest entry its state
/// refers to; installing one with the entries below it stores them in the
/// fresh log, readable after a reopen, with the log resuming after it.
fn entries_the_state_refers_to_stay_below_the_snapshot(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 2000, 1);
    wal.sync().unwrap();
    // The lowest segment file: trimming renames (recycles) or removes it.
    // (Counting files would race with spares being preallocated.)
    let first = |dir: &Path| segment_files(dir).into_iter().min().unwrap();
    let before = first(dir.path());
    let snap = |index| Snapshot {
        index,
        term: 1,
        membership: Membership::with_voters([1, 2, 3]),
        data: b"meta".to_vec(),
    };
    quire::storage::write_snapshot_file(&wal.free_snapshot_slot(), &snap(1500)).unwrap();
    wal.adopt_snapshot(1500, 1, Some(10)).unwrap();
    wal.sync().unwrap();
    assert_eq!(
        wal.read(10, 12).unwrap(),
        vec![entry(10, 1), entry(11, 1), entry(12, 1)]
    );
    assert_eq!(first(dir.path()), before, "nothing trimmed below 10");
    // Read off the loop: where the batches are, then plain reads.
    assert!(wal.holds(10) && wal.holds(2000) && !wal.holds(2001));
    let located = wal.locate(10, 12).unwrap();
    let off_loop = quire::storage::read_located(wal.dir(), &located, 10, 12).unwrap();
    assert_eq!(off_loop, vec![entry(10, 1), entry(11, 1), entry(12, 1)]);
    quire::storage::write_snapshot_file(&wal.free_snapshot_slot(), &snap(1900)).unwrap();
    wal.adopt_snapshot(1900, 1, Some(1800)).unwrap();
    // The superblock rides in the next flush; the trim follows once that
    // is durable.
    wal.sync().unwrap();
    assert!(
        wal.read(10, 10).is_err(),
        "trimmed once nothing refers to it"
    );
    assert!(
        quire::storage::read_located(wal.dir(), &located, 10, 12).is_err(),
        "a trimmed (recycled) batch is an error, not other entries"
    );
    drop(wal);
    let (mut wal, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot.map(|s| s.index), Some(1900));
    assert_eq!(wal.read(1800, 1800).unwrap(), vec![entry(1800, 1)]);
    assert_eq!(wal.read(1800, 1800).unwrap(), vec![entry(1800, 1)]);

    // A leader's snapshot at 5000 with the entries 4990..=5000 it refers to.
    let ahead = Snapshot {
        term: 4,
        ..snap(5000)
    };
    let below: Vec<Entry> = (4990..=5000).map(|i| entry(i, 4)).collect();
    let gap = [entry(4990, 4), entry(4992, 4)];
    assert!(
        wal.install_snapshot(&ahead, &gap).is_err(),
        "not consecutive"
    );
    wal.install_snapshot(&ahead, &below).unwrap();
    append_range(&mut wal, 5001, 5003, 4);
    wal.sync().unwrap();
    drop(wal);
    let (mut wal, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot.as_ref(), Some(&ahead));
    let idx: Vec<Index> = report.restored.entries.iter().map(|e| e.index).collect();
    assert_eq!(
        idx,
        vec![5001, 5002, 5003],
        "the log resumes after the snapshot"
    );
    assert_eq!(
        wal.read(4990, 5000).unwrap(),
        below,
        "kept below it, readable"
    );
    assert!(wal.read(1800, 1800).is_err(), "the old log is gone");
}

/// Snapshots are written in place into two slot files in turn; the log
/// opens with the one its superblock names, whatever the other holds (a
/// crash while writing it), and a snapshot file from before slots is
/// still read, then removed once a slot takes over.
fn snapshots_take_two_slots_in_turn(b: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path(), b);
    append_range(&mut wal, 1, 100, 1);
    wal.sync().unwrap();
    let snap = |index| Snapshot {
        index,
        term: 1,
        membership: Membership::with_voters([1, 2, 3]),
        data: format!("state at {index}").into_bytes(),
    };
    for (i, at) in [20, 40, 60].into_iter().enumerate() {
        let slot = wal.free_snapshot_slot();
        assert!(slot.ends_with(format!("snapshot.{}", i % 2)), "{slot:?}");
        quire::storage::write_snapshot_file(&slot, &snap(at)).unwrap();
        wal.adopt_snapshot(at, 1, None).unwrap();
        wal.sync().unwrap();
    }
    let free = wal.free_snapshot_slot();
    drop(wal);
    std::fs::write(&free, vec![0xff; 4096]).unwrap();
    let (wal, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot, Some(snap(60)), "the named slot");
    drop(wal);

    // From before slots: the superblock names snapshot-<index>.bin.
    for slot in 0..2 {
        let _ = std::fs::remove_file(dir.path().join(format!("snapshot.{slot}")));
    }
    let legacy = dir.path().join(format!("snapshot-{:020}.bin", 60));
    std::fs::write(
        &legacy,
        quire::storage::superblock::encode_snapshot(&snap(60)),
    )
    .unwrap();
    let (mut wal, report) = open(dir.path(), b);
    assert_eq!(
        report.restored.snapshot,
        Some(snap(60)),
        "the file from before slots"
    );
    quire::storage::write_snapshot_file(&wal.free_snapshot_slot(), &snap(80)).unwrap();
    wal.adopt_snapshot(80, 1, None).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_, report) = open(dir.path(), b);
    assert_eq!(report.restored.snapshot, Some(snap(80)));
    assert!(!legacy.exists(), "the old file goes once a slot takes over");
}
