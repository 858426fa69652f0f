//! The three output formats, one file each. Pure: results in, text out.
//!
//! - [`normal`]: fio's per-job block (IOPS and BW; slat, clat, lat; clat
//!   percentiles; then an fsync block per disk, the transport or
//!   replication block), "Run status group N", disk stats, UDP errors;
//! - [`json()`]: fio-like keys (`jobs[].write.iops`, `.bw`,
//!   `.clat_ns.percentile`, ...) plus a `bench_version`;
//! - [`terse()`]: one `;`-separated line per job, the terse version first.

mod json;
mod normal;
mod terse;

pub use json::json;
pub use normal::normal;
pub use terse::terse;

use super::engine::EngineReport;
use super::host::HostSnapshot;
use super::options::JobOptions;
use super::stats::JobStats;

/// The version of the JSON layout (`bench_version`); bumped on a change
/// that breaks a script reading it.
pub const BENCH_VERSION: u32 = 1;
/// The version of the terse line layout (its first field).
pub const TERSE_VERSION: u32 = 1;

/// One reported job: a job clone, or all clones of a job with
/// `group_reporting`.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job's options.
    pub options: JobOptions,
    /// Its stonewall group.
    pub groupid: usize,
    /// When its group started, ms after the run started.
    pub group_start_ms: u64,
    /// How many clones it sums.
    pub clones: usize,
    /// What it measured.
    pub stats: JobStats,
    /// What its engines added.
    pub engine: EngineReport,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Everything a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Per job.
    pub jobs: Vec<JobResult>,
    /// Host counters over the run.
    pub host: HostSnapshot,
    /// Unix time the run started, s.
    pub timestamp: u64,
    /// How long the host counters were collected over, ms (the whole run,
    /// every group included).
    pub host_window_ms: u64,
}

/// The latency a replicated operation waits for its commit: appends and
/// produces commit on write, consume + ack on read.
fn commit_latency(stats: &JobStats) -> &super::stats::LatencyStats {
    if stats.write.ops > 0 || stats.read.ops == 0 {
        &stats.write.lat
    } else {
        &stats.read.lat
    }
}
