//! The real WAL on the simulated device: what it acknowledged survives
//! every crash the device can produce, from a seed.

use super::*;
use crate::consensus::{Entry, Index, Membership, Payload, Snapshot};
use crate::storage::{CachedRead, DiskState, Wal, WalConfig, WalError};

fn cfg() -> WalConfig {
    WalConfig {
        segment_bytes: 64 << 10,
        flush_bytes_max: 16 << 10,
        backend: BackendChoice::Portable,
        direct_io: true,
        segments_ahead: 1,
        segments_recycled_max: 2,
        ..WalConfig::default()
    }
}

/// Entry `i`: its size and bytes follow from its index alone.
fn entry(i: Index) -> Entry {
    let len = 100 + (i * 7919 % 3000) as usize;
    let mut data = format!("entry {i}:").into_bytes();
    data.resize(len, (i % 251) as u8);
    Entry {
        term: 1,
        index: i,
        payload: Payload::Normal(data.into()),
    }
}

fn snapshot(index: Index) -> Snapshot {
    Snapshot {
        index,
        term: 1,
        membership: Membership::with_voters([1]),
        data: Vec::new(),
    }
}

/// Checks what a reopened log holds: everything acknowledged durable up
/// to `acked`, in order and intact. Returns the log, the last index it
/// holds, and whether recovery discarded a torn tail.
fn check_recovered(dir: &SimDir, acked: Index, seed: u64) -> (Wal<SimDir>, Index, bool) {
    let (wal, report) = Wal::open_in(dir.clone(), cfg())
        .unwrap_or_else(|e| panic!("seed {seed}: the log does not reopen: {e}"));
    assert!(report.corruption.is_empty(), "seed {seed}: {report}");
    let base = report.restored.snapshot.as_ref().map_or(0, |s| s.index);
    let last = report.restored.entries.last().map_or(base, |e| e.index);
    assert!(
        last >= acked,
        "seed {seed}: durable up to {acked} was acknowledged, {last} survived ({report})"
    );
    for (k, e) in report.restored.entries.iter().enumerate() {
        assert_eq!(
            e.index,
            base + 1 + k as u64,
            "seed {seed}: out of order ({report})"
        );
        assert_eq!(e, &entry(e.index), "seed {seed}: entry {} damaged", e.index);
    }
    (wal, last, report.torn_tail.is_some())
}

#[test]
fn a_log_reopens_on_the_device_with_what_it_wrote() {
    let dir = SimDir::new("g0", 1);
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    for i in 1..=60 {
        wal.append(None, &[entry(i)]).unwrap();
        wal.poll().unwrap();
    }
    wal.sync().unwrap();
    assert_eq!(wal.durable().0, 60);
    assert!(wal.backend_name() == "simulated");
    drop(wal);
    let (_, last, _) = check_recovered(&dir, 60, 1);
    assert_eq!(last, 60);
    let second = Wal::open_in(dir.clone(), cfg());
    assert!(second.is_ok(), "the lock goes with the log that held it");
}

#[test]
fn a_second_opener_of_a_live_log_is_refused() {
    let dir = SimDir::new("g0", 2);
    let (_wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    let Err(err) = Wal::open_in(dir.clone(), cfg()) else {
        panic!("two logs on one directory");
    };
    assert!(err.to_string().contains("in use"), "{err}");
}

/// Appends with flushes in flight, compacts now and then (so segments
/// are recycled and renamed), crashes at a random moment, reopens and
/// goes on: over many seeds, nothing acknowledged is ever lost.
#[test]
fn nothing_acknowledged_is_lost_in_any_crash_over_200_seeds() {
    let mut torn_tails = 0;
    let mut recycled = 0;
    for seed in 0..200u64 {
        let dir = SimDir::new("g0", seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
        let mut acked: Index = 0;
        let mut compacted: Index = 0;
        for _round in 0..4 {
            let steps = rng.gen_range(20..200);
            for _ in 0..steps {
                let next = wal.last().0 + 1;
                let n = rng.gen_range(1..=6);
                let batch: Vec<Entry> = (next..next + n).map(entry).collect();
                wal.append(None, &batch).unwrap();
                if rng.gen_bool(0.3) {
                    wal.wait().unwrap();
                } else {
                    wal.poll().unwrap();
                }
                dir.advance_us(rng.gen_range(10..500));
                acked = acked.max(wal.durable().0);
                if acked >= compacted + 80 && rng.gen_bool(0.2) {
                    compacted = acked - 20;
                    wal.compact(&snapshot(compacted)).unwrap();
                    acked = acked.max(wal.durable().0);
                }
            }
            recycled += wal.metrics().segments_recycled;
            dir.crash();
            drop(wal);
            let (reopened, _, torn) = check_recovered(&dir, acked, seed);
            wal = reopened;
            torn_tails += u64::from(torn);
        }
    }
    // A sweep that exercises nothing tests nothing.
    assert!(recycled > 0, "the sweep should recycle segments");
    assert!(
        torn_tails > 0,
        "the device should leave torn tails to recover from"
    );
}

#[test]
fn a_failed_sync_stops_the_log_and_loses_nothing_acknowledged_before() {
    let dir = SimDir::new("g0", 3);
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    wal.append(None, &(1..=10).map(entry).collect::<Vec<_>>())
        .unwrap();
    wal.sync().unwrap();
    dir.fail_next_sync();
    wal.append(None, &[entry(11)]).unwrap();
    let err = wal.sync().expect_err("the flush fails");
    assert!(matches!(err, WalError::Stopped(_)), "{err}");
    assert!(matches!(wal.state(), DiskState::Failed(_)));
    assert!(
        wal.append(None, &[entry(12)]).is_err(),
        "a stopped log takes nothing"
    );
    dir.crash();
    drop(wal);
    check_recovered(&dir, 10, 3);
}

/// A cold read that fails with an I/O error stops the log, as a failed
/// flush does: a leader left leading would fail the same read on every
/// retry of its clients, where another replica's disk may read. Its asker
/// gets the error; what was durable stays so.
#[test]
fn a_cold_read_failing_with_an_io_error_stops_the_log() {
    let dir = SimDir::new("g0", 5);
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    for i in 1..=100 {
        wal.append(None, &[entry(i)]).unwrap();
    }
    wal.sync().unwrap();
    let (name, _) = wal.locate(3, 3).unwrap().remove(0);
    assert_ne!(name, batches_on(&dir).last().unwrap().0, "an old segment");
    dir.fail_next_read();
    assert!(matches!(wal.cached(3).unwrap(), CachedRead::Reading));
    let done = wal.cold_reads_done();
    while wal.cold_reads_done() == done {
        // Waiting reports the stop too, once the read has failed.
        if wal.wait().is_err() {
            break;
        }
    }
    assert_eq!(wal.cold_reads_done(), done + 1);
    let err = wal.cached(3).expect_err("the failure is reported");
    assert!(matches!(err, WalError::Stopped(_)), "{err}");
    assert!(
        matches!(wal.state(), DiskState::Failed(_)),
        "{:?}",
        wal.state()
    );
    assert_eq!(wal.metrics().io_errors, 1);
    assert!(
        wal.append(None, &[entry(101)]).is_err(),
        "a stopped log takes nothing"
    );
    dir.crash();
    drop(wal);
    check_recovered(&dir, 100, 5);
}

/// A flush that fails stops the log for good: a later flush in flight
/// with it that succeeds must not make anything durable, whatever calls
/// collect its completion afterwards (a poll, a read). Found by the
/// cluster sweep with reads in the checker: a read after the failure
/// reported the later flush durable, and the node acknowledged the failed
/// batch's entries.
#[test]
fn a_flush_completing_after_a_failed_one_makes_nothing_durable() {
    let dir = SimDir::new("g0", 7);
    let cfg = WalConfig {
        flushes_in_flight_max: 4,
        // One segment holds it all: the failed sync is a flush's.
        segment_bytes: 1 << 20,
        segments_ahead: 0,
        ..cfg()
    };
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg).unwrap();
    wal.append(None, &(1..=10).map(entry).collect::<Vec<_>>())
        .unwrap();
    wal.sync().unwrap();
    dir.fail_next_sync();
    // Enough for several sealed batches, in flight together.
    wal.append(None, &(11..=60).map(entry).collect::<Vec<_>>())
        .unwrap();
    let err = wal.sync().expect_err("the first flush fails");
    assert!(matches!(err, WalError::Stopped(_)), "{err}");
    assert_eq!(wal.durable().0, 10);
    for _ in 0..3 {
        assert!(wal.poll().is_err(), "a stopped log says so");
        let _ = wal.read(1, 10);
        assert_eq!(
            wal.durable().0,
            10,
            "nothing after the failed flush is durable"
        );
    }
    dir.crash();
    drop(wal);
    check_recovered(&dir, 10, 7);
}

/// An I/O error while preparing a segment for a flush loses that flush's
/// batch: the log must stop there, or a later flush completing would
/// report the lost batch's entries durable (found by the cluster sweep
/// under the production glue: seed 39 on 5 nodes).
#[test]
fn an_io_error_preparing_a_segment_stops_the_log() {
    let dir = SimDir::new("g0", 5);
    let cfg = WalConfig {
        segments_ahead: 0, // every roll prepares its segment then
        ..cfg()
    };
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg).unwrap();
    wal.append(None, &[entry(1)]).unwrap();
    wal.sync().unwrap();
    dir.fail_next_create();
    let mut next = 2;
    let err = loop {
        wal.append(None, &[entry(next)]).unwrap();
        next += 1;
        match wal.sync() {
            Ok(()) => assert!(next < 500, "no segment was ever prepared"),
            Err(e) => break e,
        }
    };
    assert!(matches!(wal.state(), DiskState::Failed(_)), "{err}");
    let durable = wal.durable().0;
    assert!(durable < next - 1, "the failed batch is not durable");
    assert!(
        wal.append(None, &[entry(next)]).is_err(),
        "a stopped log takes nothing"
    );
    assert!(wal.sync().is_err());
    assert_eq!(wal.durable().0, durable);
    drop(wal);
    dir.crash();
    check_recovered(&dir, durable, 5);
}

#[test]
fn a_full_device_refuses_new_appends_and_keeps_what_it_holds() {
    let dir = SimDir::new("g0", 4);
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    wal.append(None, &(1..=5).map(entry).collect::<Vec<_>>())
        .unwrap();
    wal.sync().unwrap();
    // Room for what is there, not for another segment.
    let used = dir.dev().used_bytes();
    dir.set_capacity_bytes(Some(used + 4096));
    let mut next = 6;
    let full = loop {
        wal.append(None, &[entry(next)]).unwrap();
        next += 1;
        match wal.sync() {
            Ok(()) => assert!(next < 200, "the device never filled"),
            Err(e) => break e,
        }
    };
    assert!(matches!(full, WalError::DiskFull), "{full}");
    assert!(matches!(wal.admit(), Err(WalError::DiskFull)));
    let acked = wal.durable().0;
    assert!(acked >= 5);
    drop(wal);
    dir.set_capacity_bytes(None);
    check_recovered(&dir, acked, 4);
}

/// A snapshot install cut short after the entries kept with it are
/// durable, before the snapshot is recorded (here: no room for the
/// snapshot file; a crash there is the same), leaves the old log in
/// force. The kept entries would read as a rewrite of the log from the
/// first of them and cut off entries this node had acknowledged (found by
/// the production glue's sweep: queue workload, seed 181 on 5 nodes).
#[test]
fn an_install_cut_short_before_its_snapshot_is_recorded_keeps_the_old_log() {
    let dir = SimDir::new("g0", 6);
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg()).unwrap();
    wal.append(None, &(1..=40).map(entry).collect::<Vec<_>>())
        .unwrap();
    wal.sync().unwrap();
    let acked = wal.durable().0;
    // Room for the fresh segments, not for a first snapshot file (1 MiB).
    dir.set_capacity_bytes(Some(dir.used_bytes() + (256 << 10)));
    // More than a segment holds: the install fills two (seed 1642 of the
    // queue sweep on 3 nodes, where only the first was removed).
    let below: Vec<Entry> = (5..=40).map(entry).collect();
    let err = wal
        .install_snapshot(&snapshot(100), &below)
        .expect_err("no room for the snapshot file");
    assert!(matches!(err, WalError::DiskFull), "{err}");
    drop(wal);
    dir.crash();
    dir.set_capacity_bytes(None);
    let (_, last, _) = check_recovered(&dir, acked, 6);
    assert_eq!(last, 40);
}

/// Where each batch of the log lies: (segment file, offset, first index).
fn batches_on(dir: &SimDir) -> Vec<(String, u64, Index)> {
    use crate::storage::format::{decode_batch, BLOCK_BYTES};
    let mut out = Vec::new();
    for name in dir.list().unwrap() {
        let Some(id) = name
            .strip_suffix(".seg")
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        else {
            continue;
        };
        let bytes = dir.contents(&name).unwrap();
        let mut off = 0;
        while off + BLOCK_BYTES <= bytes.len() {
            match decode_batch(&bytes[off..]) {
                Ok(b) if b.place.segment == id && !b.entries.is_empty() => {
                    out.push((name.clone(), off as u64, b.first_index));
                    off += b.disk_bytes;
                }
                _ => off += BLOCK_BYTES,
            }
        }
    }
    out
}

/// Writes a log, rots one byte of a batch in its middle (followed by many
/// later flushes), reopens it, and checks that every acknowledged entry is
/// restored or inside the range the node must fetch again before it votes.
fn rot_and_recover(seed: u64, planted: bool) -> Result<bool, String> {
    let dir = SimDir::new("g0", seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cfg = WalConfig {
        planted_truncate_on_corruption: planted,
        ..cfg()
    };
    let (mut wal, _) = Wal::open_in(dir.clone(), cfg.clone()).unwrap();
    let last = rng.gen_range(100..300);
    let mut next = 1;
    while next <= last {
        let n = rng.gen_range(1..=8).min(last + 1 - next);
        wal.append(None, &(next..next + n).map(entry).collect::<Vec<_>>())
            .unwrap();
        wal.sync().unwrap();
        next += n;
    }
    drop(wal);
    let batches = batches_on(&dir);
    let (name, offset, _) = &batches[rng.gen_range(0..batches.len() / 2)];
    let at = offset + rng.gen_range(64..512);
    let byte = dir.contents(name).unwrap()[at as usize];
    dir.rot(name, at, &[byte ^ 0x5a]);
    let (_, report) = Wal::open_in(dir.clone(), cfg).unwrap();
    let held: std::collections::BTreeSet<Index> =
        report.restored.entries.iter().map(|e| e.index).collect();
    let repair = report.restored.repair_until.unwrap_or(0);
    let trusted_end = held.iter().next_back().copied().unwrap_or(0);
    for i in 1..=last {
        let covered = held.contains(&i) || (i > trusted_end && i <= repair);
        if !covered {
            return Err(format!(
                "seed {seed}: acknowledged entry {i} lost ({report})"
            ));
        }
    }
    Ok(!report.corruption.is_empty())
}

#[test]
fn damage_in_the_middle_is_reported_for_repair_and_a_truncating_recovery_is_caught() {
    let mut reported = 0;
    for seed in 0..200 {
        reported += u32::from(rot_and_recover(seed, false).unwrap());
    }
    assert!(
        reported > 100,
        "most rots should be found as corruption: {reported}"
    );
    let caught = (0..200).find(|&seed| rot_and_recover(seed, true).is_err());
    assert!(
        caught.is_some(),
        "a recovery that truncates at the damage must lose acknowledged entries"
    );
}
