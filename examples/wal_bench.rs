//! The storage path alone: appends of fixed-size records with a fixed
//! number outstanding, group-committed by the WAL, on a directory of the
//! disk under test. Prints throughput, records and bytes per fdatasync and
//! flush latency percentiles; `bench/wal-vs-fio.sh` runs it beside fio.
//!
//! cargo run --release --example wal_bench -- DIR [record_bytes] [outstanding] [seconds] [backend] [flush_bytes_max]

use quire::consensus::{Entry, Membership, Payload, Snapshot};
use quire::io::BackendChoice;
use quire::storage::{Wal, WalConfig};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .expect("usage: wal_bench DIR [record_bytes] [outstanding] [seconds] [backend]");
    let record_bytes: usize = args
        .get(2)
        .map_or(1024, |s| s.parse().expect("record_bytes"));
    let outstanding: u64 = args.get(3).map_or(256, |s| s.parse().expect("outstanding"));
    let seconds: u64 = args.get(4).map_or(10, |s| s.parse().expect("seconds"));
    let backend: BackendChoice = args
        .get(5)
        .map_or(BackendChoice::Auto, |s| s.parse().expect("backend"));
    let defaults = WalConfig::default();
    let flush_bytes_max: usize = args.get(6).map_or(defaults.flush_bytes_max, |s| {
        s.parse().expect("flush_bytes_max")
    });
    let _ = std::fs::remove_dir_all(dir);
    // Steady state of a node that snapshots: the log is trimmed behind the
    // writer and trimmed segments are recycled, so the run writes into a
    // ring of segments laid out once before timing, as fio overwrites the
    // file it lays out before timing.
    const RING_SEGMENTS: u32 = 8;
    let cfg = WalConfig {
        backend,
        segments_recycled_max: RING_SEGMENTS,
        flush_bytes_max,
        ..defaults
    };
    let segment_bytes = cfg.segment_bytes;
    let (mut wal, report) = Wal::open(std::path::Path::new(dir), cfg).expect("open");
    eprintln!("{report}");
    wal.prepare_segments(RING_SEGMENTS)
        .expect("segments prepared");
    let zero_filled_before = wal.metrics().segments_zero_filled;
    let mut trimmed_at_bytes = 0u64;
    let payload = vec![0xa5u8; record_bytes];
    let mut next = 1u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        // Keep `outstanding` records queued or in flight, as clients would.
        let durable = wal.durable().0;
        while next - 1 - durable < outstanding {
            let e = Entry {
                term: 1,
                index: next,
                payload: Payload::Normal(payload.clone().into()),
            };
            wal.append(None, std::slice::from_ref(&e)).expect("append");
            next += 1;
        }
        wal.poll().expect("poll");
        wal.wait().expect("wait");
        if wal.metrics().bytes - trimmed_at_bytes >= segment_bytes {
            // A snapshot at the durable index: whole segments below it go.
            trimmed_at_bytes = wal.metrics().bytes;
            let snap = Snapshot {
                index: wal.durable().0,
                term: 1,
                membership: Membership::with_voters([1]),
                data: Vec::new(),
            };
            wal.compact(&snap).expect("compact");
        }
    }
    wal.sync().expect("sync");
    let elapsed = started.elapsed().as_secs_f64();
    let m = wal.metrics();
    let records = m.records;
    let q = |h: &hdrhistogram::Histogram<u64>, p: f64| h.value_at_quantile(p);
    println!(
        "quire wal ({}, {}): {:.1} MB/s on disk, {:.1} MB/s of records, {:.0} records/s; per fdatasync: {:.1} records (p50 {}), {:.0} KiB (p50 {} KiB); flush latency p50 {} us, p99 {} us; {} flushes",
        wal.backend_name(),
        if wal.direct_io() { "O_DIRECT" } else { "buffered" },
        m.bytes as f64 / elapsed / 1e6,
        (records as f64 * record_bytes as f64) / elapsed / 1e6,
        records as f64 / elapsed,
        records as f64 / m.flushes.max(1) as f64,
        q(&m.records_per_flush, 0.5),
        m.bytes as f64 / m.flushes.max(1) as f64 / 1024.0,
        q(&m.bytes_per_flush, 0.5) / 1024,
        q(&m.flush_latency_us, 0.5),
        q(&m.flush_latency_us, 0.99),
        m.flushes
    );
    println!(
        "segments: {} recycled, {} zero-filled while timing",
        m.segments_recycled,
        m.segments_zero_filled - zero_filled_before
    );
    println!("BYTES_PER_FLUSH={}", m.bytes / m.flushes.max(1));
    println!("DISK_MBPS={:.3}", m.bytes as f64 / elapsed / 1e6);
    drop(wal);
    let _ = std::fs::remove_dir_all(dir);
}
