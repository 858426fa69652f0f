//! `quire tune disk DIR`: a short disk probe in the spirit of `rpk
//! iotune`. It writes sequentially into a preallocated file, as the WAL
//! does (O_DIRECT where the filesystem takes it), with an fdatasync after
//! every write, at several write sizes; reports each size's latency and
//! throughput, recommends `storage.flush_bytes_max`, and estimates the
//! commit latency a group will see on this disk.

use crate::io::AlignedBuf;
use hdrhistogram::Histogram;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// The write sizes probed.
pub const SIZES: [usize; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The probe file's size: writes wrap around in it.
const FILE_BYTES: u64 = 64 << 20;

/// One write size's figures.
#[derive(Clone, Debug)]
pub struct SizeResult {
    /// Bytes per write (and per fdatasync).
    pub bytes: usize,
    /// Write + fdatasync pairs done.
    pub ops: u64,
    /// Latency of a write + fdatasync, µs: median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Bytes per second over the run.
    pub bytes_per_s: f64,
}

/// What the probe found.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Whether O_DIRECT was accepted.
    pub direct: bool,
    /// Per write size.
    pub sizes: Vec<SizeResult>,
    /// The smallest size that reaches 90% of the best throughput.
    pub recommended_flush_bytes: usize,
    /// A commit's disk part: the leader's and a follower's flushes run in
    /// parallel, so about one small flush; add the network round trip.
    pub commit_disk_us: u64,
}

/// Probes the disk holding `dir` for about `per_size` per write size.
/// `dir` must be an existing directory: creating it would probe the
/// filesystem of its nearest existing parent (a typo would measure `/`).
pub fn probe(dir: &Path, per_size: Duration) -> io::Result<Probe> {
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        ));
    }
    let path = dir.join("quire-tune-disk.probe");
    // Lay the file out once (like the WAL's preallocated segments), so the
    // timed writes overwrite allocated blocks.
    {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(crate::io::private::FILE_MODE)
            .open(&path)?;
        let zeros = vec![0u8; 1 << 20];
        for i in 0..FILE_BYTES / (1 << 20) {
            f.write_all_at(&zeros, i * (1 << 20))?;
        }
        f.sync_all()?;
    }
    let direct_file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let (file, direct) = match direct_file {
        Ok(f) => (f, true),
        Err(_) => (OpenOptions::new().write(true).open(&path)?, false),
    };
    let mut buf = AlignedBuf::with_capacity(SIZES[SIZES.len() - 1]);
    buf.resize_zeroed(SIZES[SIZES.len() - 1]);
    buf.as_mut_slice().fill(0x5a);
    let mut sizes = Vec::new();
    for &bytes in &SIZES {
        let mut h = Histogram::<u64>::new(3).map_err(|e| io::Error::other(e.to_string()))?;
        let mut offset = 0u64;
        let mut ops = 0u64;
        let started = Instant::now();
        while started.elapsed() < per_size || ops < 8 {
            let t = Instant::now();
            file.write_all_at(&buf.as_slice()[..bytes], offset)?;
            file.sync_data()?;
            h.record(t.elapsed().as_micros().max(1) as u64)
                .map_err(|e| io::Error::other(e.to_string()))?;
            ops += 1;
            offset = (offset + bytes as u64) % FILE_BYTES;
        }
        let secs = started.elapsed().as_secs_f64();
        sizes.push(SizeResult {
            bytes,
            ops,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            bytes_per_s: (ops * bytes as u64) as f64 / secs,
        });
    }
    let _ = std::fs::remove_file(&path);
    let best = sizes.iter().map(|s| s.bytes_per_s).fold(0.0, f64::max);
    let recommended_flush_bytes = sizes
        .iter()
        .find(|s| s.bytes_per_s >= 0.9 * best)
        .map_or(SIZES[SIZES.len() - 1], |s| s.bytes);
    let commit_disk_us = sizes[0].p50_us;
    Ok(Probe {
        direct,
        sizes,
        recommended_flush_bytes,
        commit_disk_us,
    })
}

/// The probe's report as text.
pub fn render(p: &Probe) -> String {
    let mut s = format!(
        "disk probe ({}): write + fdatasync, sequential, per size\n  size      ops   p50 us   p99 us     MB/s\n",
        if p.direct { "O_DIRECT" } else { "buffered: O_DIRECT refused" }
    );
    for r in &p.sizes {
        s += &format!(
            "  {:>5} KiB {:>6} {:>8} {:>8} {:>8.1}\n",
            r.bytes >> 10,
            r.ops,
            r.p50_us,
            r.p99_us,
            r.bytes_per_s / 1e6
        );
    }
    s += &format!(
        "recommend: storage.flush_bytes_max = {} ({} KiB: the smallest write within 90% of the best throughput)\n",
        p.recommended_flush_bytes,
        p.recommended_flush_bytes >> 10
    );
    s += &format!(
        "expect: a commit's disk part about {} us (leader and follower flush in parallel); add the network round trip\n",
        p.commit_disk_us
    );
    s
}
