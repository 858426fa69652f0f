//! Crash test on real files: a child process appends to the log with many
//! records in flight and reports each durable index on stdout, then waits
//! for a go-ahead on stdin; the parent SIGKILLs it at a random report
//! (while it holds appended but unflushed records and flushes in flight)
//! and checks that every record reported durable is intact and in order.
//! Repeated many times, on both backends, continuing the same log. The
//! child also compacts now and then, as a node that snapshots does, so the
//! log runs through recycled segments that still hold older batches.
//!
//! A process kill leaves the kernel's page cache intact, so this catches
//! durability reported for records not yet handed to the kernel; lost
//! unsynced data on power loss is the simulator's disk model's job.

use quire::consensus::{Entry, Index, Membership, Payload, Snapshot};
use quire::io::BackendChoice;
use quire::storage::{Wal, WalConfig};
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "QUIRE_WAL_CRASH_CHILD";

fn cfg(backend: BackendChoice) -> WalConfig {
    WalConfig {
        segment_bytes: 512 << 10,
        flush_bytes_max: 64 << 10,
        backend,
        ..WalConfig::default()
    }
}

/// The payload of index `i`: checkable without remembering anything.
fn payload(i: Index) -> Vec<u8> {
    let len = 100 + (i * 7919 % 1900) as usize;
    let mut v = format!("entry {i}:").into_bytes();
    v.resize(len, (i % 251) as u8);
    v
}

fn backend_from(s: &str) -> BackendChoice {
    s.parse().expect("backend name")
}

/// Runs as the child when the environment says so; a no-op test otherwise.
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (backend, dir) = spec.split_once(':').expect("backend:dir");
    let (mut wal, report) =
        Wal::open(Path::new(dir), cfg(backend_from(backend))).expect("child opens");
    let mut next = report.restored.entries.last().map_or(1, |e| e.index + 1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(next);
    let mut reported = 0;
    let mut compacted = report.restored.snapshot.as_ref().map_or(0, |s| s.index);
    let mut out = std::io::stdout().lock();
    let mut go = std::io::stdin().lock();
    loop {
        // Keep up to 256 records outstanding beyond what is durable.
        while next - wal.durable().0 <= 256 {
            let n = rng.gen_range(1..=16);
            let entries: Vec<Entry> = (next..next + n)
                .map(|i| Entry {
                    term: 1,
                    index: i,
                    payload: Payload::Normal(payload(i).into()),
                })
                .collect();
            wal.append(None, &entries).expect("append");
            next += n;
            wal.poll().expect("poll");
        }
        wal.wait().expect("wait");
        let d = wal.durable().0;
        if d >= compacted + 1000 {
            // Keep the last 300 entries; whole segments below go to recycling.
            compacted = d - 300;
            let snap = Snapshot {
                index: compacted,
                term: 1,
                membership: Membership::with_voters([1]),
                data: Vec::new(),
            };
            wal.compact(&snap).expect("compact");
        }
        if d > reported {
            reported = d;
            let recycled = wal.metrics().segments_recycled;
            writeln!(out, "durable {d} recycled {recycled}").unwrap();
            out.flush().unwrap();
            // Freeze here until the parent decides: go on, or SIGKILL.
            let mut byte = [0u8; 1];
            if std::io::Read::read_exact(&mut go, &mut byte).is_err() {
                return;
            }
        }
    }
}

/// Held for a whole round. The two tests run in threads of one process:
/// a child spawned by one inherits, until its `exec`, the other's open
/// log lock (an `flock` belongs to the open file, not the descriptor), and
/// the other's child would then find its log "in use by another process".
static ROUND: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn crash_rounds(backend: BackendChoice, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut confirmed_before: Index = 0;
    let mut recycled = 0;
    for round in 0..rounds {
        let _round = ROUND.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(
                CHILD_ENV,
                format!("{}:{}", backend_name(backend), dir.path().display()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let reports_before_kill = rng.gen_range(1..=40);
        let mut max_durable = 0;
        let mut recycled_in_round = 0;
        let mut seen = 0;
        let stdout = child.stdout.take().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            // libtest may print "test crash_child ... " on the same line.
            if let Some(rest) = line.split("durable ").nth(1) {
                let mut words = rest.split_whitespace();
                max_durable = words.next().unwrap().parse::<Index>().unwrap();
                let r: u64 = words.nth(1).unwrap().parse().unwrap();
                recycled_in_round = recycled_in_round.max(r);
                seen += 1;
                if seen == reports_before_kill {
                    break;
                }
                stdin.write_all(b"c").unwrap();
                stdin.flush().unwrap();
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        recycled += recycled_in_round;
        assert!(seen > 0, "round {round}: the child never reported progress");

        let (wal, report) = Wal::open(dir.path(), cfg(backend)).expect("reopens after SIGKILL");
        let entries = &report.restored.entries;
        let base = report.restored.snapshot.as_ref().map_or(0, |s| s.index);
        assert!(report.corruption.is_empty(), "round {round}: {report}");
        let last = entries.last().map_or(0, |e| e.index);
        assert!(
            last >= max_durable.max(confirmed_before),
            "round {round}: reported durable up to {max_durable} but only {last} survived ({report})"
        );
        for (k, e) in entries.iter().enumerate() {
            assert_eq!(
                e.index,
                base + k as u64 + 1,
                "round {round}: entries out of order"
            );
            assert_eq!(
                e.payload,
                Payload::Normal(payload(e.index).into()),
                "round {round}: entry {} damaged",
                e.index
            );
        }
        confirmed_before = last;
        drop(wal);
    }
    println!(
        "{rounds} crash rounds on {backend:?}: log up to {confirmed_before} intact, {recycled} segments recycled"
    );
    assert!(
        recycled > 0,
        "the run should have written into recycled segments"
    );
}

fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::IoUring => "io_uring",
        BackendChoice::Portable => "portable",
        BackendChoice::Auto => "auto",
    }
}

#[test]
fn sigkill_loses_nothing_reported_durable_io_uring() {
    if quire::io::uring::UringBackend::new(8).is_err() {
        println!("skipping: io_uring cannot be set up here");
        return;
    }
    crash_rounds(BackendChoice::IoUring, 25);
}

#[test]
fn sigkill_loses_nothing_reported_durable_portable() {
    crash_rounds(BackendChoice::Portable, 25);
}
