use super::super::test_support::{append_durably, entry, indexes, small_cfg};
use super::*;

#[test]
fn reads_span_batches_and_segments_and_come_from_the_cache_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 50);
    assert!(wal.segments.len() > 1, "the test wants several segments");
    let all = wal.read(1, 50).unwrap();
    assert_eq!(all, (1..=50).map(entry).collect::<Vec<_>>());
    assert!(wal.cache_bytes > 0 && wal.cache_bytes <= wal.cfg.read_cache_bytes);
    assert_eq!(indexes(&wal.read(20, 22).unwrap()), [20, 21, 22]);
    // Reads stop at what is durable; below the log is an error.
    assert_eq!(indexes(&wal.read(49, 51).unwrap()), [49, 50]);
    let err = wal.read(0, 2).expect_err("0 is not in the log");
    assert!(matches!(err, WalError::Invalid(_)), "{err}");
}

#[test]
fn located_batches_are_read_on_another_thread_and_a_reused_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 30);
    let located = wal.locate(5, 25).unwrap();
    let read = std::thread::spawn({
        let (located, dir) = (located.clone(), wal.dir().clone());
        move || read_located(&dir, &located, 5, 25)
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(indexes(&read), (5..=25).collect::<Vec<_>>());
    // The same place holding another batch (a reused segment) is
    // refused, never read as other entries.
    let (name, mut loc) = located[0].clone();
    loc.seq += 1000;
    let err = read_located(wal.dir(), &[(name, loc)], 5, 25).expect_err("refused");
    assert!(matches!(err, WalError::Corrupt(_)), "{err}");
}

/// Waits until a cold read finishes (one is in flight).
fn until_a_cold_read_is_done(wal: &mut Wal) {
    let done = wal.cold_reads_done();
    while wal.cold_reads_done() == done {
        wal.wait().unwrap();
    }
}

fn cold_reads_never_wait_and_are_bounded_on(backend: crate::io::BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WalConfig {
        backend,
        ..small_cfg()
    };
    let (mut wal, _) = Wal::open(dir.path(), cfg).unwrap();
    append_durably(&mut wal, 50);
    // The first ask starts the read and answers at once; asking again
    // before it is done does not start another.
    assert!(matches!(wal.cached(20).unwrap(), CachedRead::Reading));
    assert!(matches!(wal.cached(20).unwrap(), CachedRead::Reading));
    assert_eq!(wal.cold_reads_in_flight(), 1);
    until_a_cold_read_is_done(&mut wal);
    assert_eq!(wal.cold_reads_in_flight(), 0);
    match wal.cached(20).unwrap() {
        CachedRead::Entry(e) => assert_eq!(e, entry(20)),
        other => panic!("{other:?}"),
    }
    assert_eq!(wal.metrics().cold_reads, 1);
    // Many at once: at most COLD_READS_IN_FLIGHT_MAX in flight; the
    // rest start as earlier ones finish, and every entry comes back.
    let mut got = BTreeMap::new();
    while got.len() < 40 {
        for i in 1..=40 {
            if let CachedRead::Entry(e) = wal.cached(i).unwrap() {
                got.insert(i, e);
            }
        }
        assert!(wal.cold_reads_in_flight() <= COLD_READS_IN_FLIGHT_MAX);
        if got.len() < 40 {
            until_a_cold_read_is_done(&mut wal);
        }
    }
    assert!(got.iter().all(|(i, e)| *e == entry(*i)));
    assert!(wal.cache_bytes <= wal.cfg.read_cache_bytes);
    // Past the durable end, or below the log, is an error, not a read.
    assert!(matches!(wal.cached(51), Err(WalError::Invalid(_))));
    assert!(matches!(wal.cached(0), Err(WalError::Invalid(_))));
}

#[test]
fn cold_reads_never_wait_and_are_bounded() {
    cold_reads_never_wait_and_are_bounded_on(crate::io::BackendChoice::Portable);
    if crate::io::uring::UringBackend::new(8).is_ok() {
        cold_reads_never_wait_and_are_bounded_on(crate::io::BackendChoice::IoUring);
    } else {
        eprintln!("io_uring is not available here: only the portable backend was tried");
    }
}

#[test]
fn a_failed_cold_read_is_reported_once_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    append_durably(&mut wal, 50);
    let (name, _) = wal.locate(3, 3).unwrap().remove(0);
    assert_ne!(
        name,
        segment_name(wal.active),
        "the test damages a segment not written any more"
    );
    // The segment loses its bytes under the open log.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(&name))
        .unwrap();
    f.set_len(0).unwrap();
    assert!(matches!(wal.cached(3).unwrap(), CachedRead::Reading));
    until_a_cold_read_is_done(&mut wal);
    assert_eq!(
        (wal.metrics().cold_reads, wal.metrics().cold_read_errors),
        (0, 1)
    );
    let err = wal.cached(3).expect_err("the failure is reported");
    assert!(matches!(err, WalError::Corrupt(_)), "{err}");
    // Reported once: the next ask tries again.
    assert!(matches!(wal.cached(3).unwrap(), CachedRead::Reading));
    until_a_cold_read_is_done(&mut wal);
    assert!(wal.cached(3).is_err());
    // The log still takes appends and makes them durable.
    assert_eq!(*wal.state(), DiskState::Healthy);
    append_durably(&mut wal, 1);
    assert_eq!(wal.durable().0, 51);
}
