//! Disk full, on a real (small, loop-mounted) filesystem: appends are
//! refused with DiskFull once no segment can be prepared, nothing already
//! durable is lost, and appends resume once space returns. Needs root and
//! mkfs.ext4; prints why it skips otherwise.

mod common;

use common::LoopFs;
use quire::consensus::{Entry, Payload};
use quire::io::BackendChoice;
use quire::storage::{DiskState, Wal, WalConfig, WalError};
use std::path::Path;

/// A fresh 24 MiB ext4 filesystem, or why there is none.
fn small_filesystem() -> Result<LoopFs, String> {
    LoopFs::new(24)
}

fn cfg(backend: BackendChoice) -> WalConfig {
    WalConfig {
        segment_bytes: 2 << 20,
        flush_bytes_max: 128 << 10,
        space_retry_ms: 0,
        backend,
        ..WalConfig::default()
    }
}

fn entry(i: u64) -> Entry {
    Entry {
        term: 1,
        index: i,
        payload: Payload::Normal(vec![(i % 251) as u8; 1000].into()),
    }
}

/// Appends until the log refuses; returns the next index to append.
fn append_until_full(wal: &mut Wal, mut next: u64) -> u64 {
    for _ in 0..100_000 {
        match wal.admit() {
            Err(WalError::DiskFull) => return next,
            Err(e) => panic!("unexpected error: {e}"),
            Ok(()) => {}
        }
        let batch: Vec<Entry> = (next..next + 32).map(entry).collect();
        wal.append(None, &batch).expect("append is queued");
        next += 32;
        match wal.sync() {
            Ok(()) | Err(WalError::DiskFull) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    panic!("the disk never filled up");
}

fn check_intact(dir: &Path, backend: BackendChoice, at_least: u64) -> u64 {
    let (_, report) = Wal::open(dir, cfg(backend)).expect("reopens on a full disk");
    let entries = &report.restored.entries;
    let last = entries.last().map_or(0, |e| e.index);
    assert!(
        last >= at_least,
        "durable {at_least} but only {last} recovered"
    );
    for (k, e) in entries.iter().enumerate() {
        assert_eq!(*e, entry(k as u64 + 1), "entry {} damaged", k + 1);
    }
    last
}

/// Writes `path` until the filesystem has no space left.
fn fill_remaining_space(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![1u8; 256 << 10];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

fn disk_full_refuses_then_resumes(backend: BackendChoice) {
    let fs = match small_filesystem() {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipping the ENOSPC test: {why}");
            return;
        }
    };
    let dir = fs.path().join("log");
    // Leave room for a few segments only.
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![1u8; 12 << 20]).unwrap();

    let (mut wal, _) = Wal::open(&dir, cfg(backend)).unwrap();
    let next = append_until_full(&mut wal, 1);
    assert_eq!(*wal.state(), DiskState::Full);
    assert!(matches!(wal.admit(), Err(WalError::DiskFull)));
    assert!(wal.metrics().disk_full_refusals > 0);
    let durable = wal.durable().0;
    assert!(
        durable > 0 && durable < next - 1,
        "some appends wait for space"
    );

    // Space returns while the log is open: the waiting appends land.
    std::fs::remove_file(&filler).unwrap();
    wal.sync().expect("appends resume once space returns");
    wal.admit().expect("new appends are admitted again");
    assert_eq!(*wal.state(), DiskState::Healthy);
    assert_eq!(wal.durable().0, next - 1, "nothing queued was dropped");

    // Fill it up again and restart on the full disk: all durable survives.
    fill_remaining_space(&filler);
    let next = append_until_full(&mut wal, next);
    let durable = wal.durable().0;
    assert!(durable < next - 1);
    drop(wal);
    let last = check_intact(&dir, backend, durable);
    let (mut wal, _) = Wal::open(&dir, cfg(backend)).unwrap();
    std::fs::remove_file(&filler).unwrap();
    let batch: Vec<Entry> = (last + 1..=last + 500).map(entry).collect();
    wal.append(None, &batch).unwrap();
    wal.sync().expect("appends continue after the restart");
    drop(wal);
    check_intact(&dir, backend, last + 500);
}

#[test]
fn disk_full_io_uring() {
    if quire::io::uring::UringBackend::new(8).is_err() {
        println!("skipping: io_uring cannot be set up here");
        return;
    }
    disk_full_refuses_then_resumes(BackendChoice::IoUring);
}

#[test]
fn disk_full_portable() {
    disk_full_refuses_then_resumes(BackendChoice::Portable);
}
