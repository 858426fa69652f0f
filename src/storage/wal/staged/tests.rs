use super::super::segments::segment_name;
use super::super::test_support::{append_durably, entry, indexes, small_cfg, snapshot};
use super::super::Wal;
use super::*;
use crate::storage::dir::OsDir;

/// Stages entries 40..=100 of an image of the snapshot at 100 (with
/// `meta` as its first part), five entries (15 KiB) a chunk, across
/// several staged files; stops after `upto` (inclusive).
fn stage(st: &mut StagedImage<OsDir>, upto: Index) {
    let meta_end = st.head.total - 61;
    if st.head.meta_bytes == 0 {
        st.add_meta(b"header and state", meta_end).unwrap();
    }
    let mut next = if st.head.next_index == 0 {
        40
    } else {
        st.head.next_index
    };
    while next <= upto {
        let last = (next + 4).min(upto);
        let entries: Vec<Entry> = (next..=last).map(entry).collect();
        st.add_entries(next, &entries, meta_end + last - 39)
            .unwrap();
        next = last + 1;
    }
}

#[test]
fn a_staged_image_resumes_after_a_crash_and_becomes_the_log_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 10);
    let os = OsDir::new(dir.path());
    let snap = snapshot(100);
    let total = 16 + 61;
    let numbers = wal.staged_numbers();
    let mut st =
        StagedImage::begin(os.clone(), &snap, total, numbers, wal.segment_bytes()).unwrap();
    stage(&mut st, 71);
    assert!(st.head.files >= 2, "several files: {:?}", st.head);
    // A chunk in flight at the crash went further than the manifest.
    let more: Vec<Entry> = (72..=76).map(entry).collect();
    let head = st.head.clone();
    st.add_entries(72, &more, head.held + 5).unwrap();
    let (f, _, _) = os.open(MANIFEST, false).unwrap();
    f.write_at(&head.encode(), 0).unwrap();
    drop(st);
    // The live log is untouched meanwhile, and reopens without them.
    drop(wal);
    let (mut wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
    assert_eq!(
        indexes(&report.restored.entries),
        (1..=10).collect::<Vec<_>>()
    );
    let mut st = StagedImage::resume(os.clone(), wal.segment_bytes())
        .unwrap()
        .expect("resumed");
    assert_eq!(st.head, head);
    assert_eq!(st.meta, b"header and state");
    stage(&mut st, 100);
    assert!(st.complete());
    wal.adopt_staged(&snap, st).unwrap();
    let names = os.list().unwrap();
    assert!(names
        .iter()
        .all(|n| !n.contains("staged") && !n.ends_with(".replaced")));
    assert_eq!(wal.last().0, 100);
    assert!(!wal.holds(5) && wal.holds(40) && wal.holds(100));
    append_durably(&mut wal, 3);
    assert_eq!(
        indexes(&wal.read(40, 103).unwrap()),
        (40..=103).collect::<Vec<_>>()
    );
    drop(wal);
    let (wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
    assert_eq!(report.restored.snapshot.map(|s| s.index), Some(100));
    assert_eq!(indexes(&report.restored.entries), [101, 102, 103]);
    assert!((40..=103).all(|i| wal.holds(i)));
}

#[test]
fn segments_set_aside_by_an_unfinished_adoption_come_back_and_a_finished_ones_go() {
    let dir = tempfile::tempdir().unwrap();
    let os = OsDir::new(dir.path());
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 10);
    let ids: Vec<u64> = wal.segments.keys().copied().collect();
    // A crash inside `adopt_staged`, before the snapshot is recorded:
    // staged segments renamed in, old ones set aside.
    let base = wal.staged_numbers().0;
    wal.sb.install_segment = base;
    wal.write_superblock_now().unwrap();
    drop(wal);
    for &id in &ids {
        os.rename(&segment_name(id), &replaced_name(id)).unwrap();
    }
    os.open(&segment_name(base), false).unwrap();
    let (wal, report) = Wal::open(dir.path(), small_cfg()).unwrap();
    assert_eq!(
        indexes(&report.restored.entries),
        (1..=10).collect::<Vec<_>>()
    );
    assert!(
        !os.exists(&segment_name(base)),
        "the unfinished install's segment goes"
    );
    drop(wal);
    // After it, with the snapshot recorded: set-aside segments go.
    os.rename(&segment_name(ids[0]), &replaced_name(ids[0]))
        .unwrap();
    drop(Wal::open(dir.path(), small_cfg()).unwrap());
    assert!(!os.exists(&replaced_name(ids[0])));
}

#[test]
fn a_damaged_staged_image_is_dropped_at_resume_and_a_partial_one_is_not_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 3);
    let os = OsDir::new(dir.path());
    let snap = snapshot(100);
    let numbers = wal.staged_numbers();
    let mut st =
        StagedImage::begin(os.clone(), &snap, 16 + 61, numbers, wal.segment_bytes()).unwrap();
    stage(&mut st, 60);
    let err = wal.adopt_staged(&snap, st).expect_err("incomplete");
    assert!(matches!(err, WalError::Invalid(_)), "{err}");
    assert_eq!(wal.last().0, 3, "the live log stays");
    let first = os
        .list()
        .unwrap()
        .into_iter()
        .find(|n| n.ends_with(".staged"))
        .unwrap();
    let (f, _, _) = os.open(&first, false).unwrap();
    f.write_at(b"rot", 100).unwrap();
    assert!(StagedImage::resume(os.clone(), wal.segment_bytes())
        .unwrap()
        .is_none());
    assert!(os.list().unwrap().iter().all(|n| !n.contains("staged")));
}

#[test]
fn a_manifest_round_trips_and_any_damage_is_refused() {
    let head = StagedHead {
        index: 90,
        term: 3,
        membership: Membership::with_voters([1, 2, 3]),
        total: 1234,
        held: 600,
        meta_bytes: 77,
        seg_base: 1 << 20,
        seq_base: 1 << 40,
        files: 2,
        end_offset: 8192,
        next_seq: (1 << 40) + 5,
        next_index: 41,
        last: (40, 3),
    };
    let bytes = head.encode();
    assert_eq!(StagedHead::decode(&bytes), Some(head));
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 1;
        assert_eq!(StagedHead::decode(&b), None, "byte {i} flipped");
    }
    assert_eq!(StagedHead::decode(&bytes[..bytes.len() - 1]), None);
}
