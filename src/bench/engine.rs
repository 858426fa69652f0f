//! The interface between the open-loop runner and what it measures, and the
//! engine-specific blocks of the report (fsync, transport, replication).
//!
//! An engine is asynchronous in the io_uring sense: `submit` hands it an
//! operation and returns at once, `poll` waits a bounded time and hands
//! back what completed. That is what lets one job keep `iodepth` operations
//! in flight on one thread, and lets a test plug in a fake target.

use super::error::{BenchError, OpError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Which way an operation moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Append, produce, send.
    Write,
    /// Read, tail, consume.
    Read,
}

/// One operation for an engine.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// Unique within the job; completions carry it back.
    pub id: u64,
    /// Direction.
    pub kind: OpKind,
    /// Record size, bytes.
    pub bytes: usize,
}

/// One finished operation.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The id of the [`Op`].
    pub id: u64,
    /// Bytes moved, or the error (its `Display` is a short stable label:
    /// errors are counted by it).
    pub result: Result<u64, OpError>,
    /// When it finished, if the engine saw it finish on another thread
    /// (the runner stamps the others when `poll` returns them).
    pub finished: Option<Instant>,
}

/// A target the runner drives.
pub trait Engine {
    /// Starts `op`. May complete it at once (pushing to `done`); must not
    /// block for longer than handing it over takes.
    fn submit(&mut self, op: Op, done: &mut Vec<Completion>) -> Result<(), BenchError>;

    /// Waits up to about `timeout` for operations to complete and pushes
    /// them to `done`. Called only while operations are in flight.
    fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) -> Result<(), BenchError>;

    /// Called once after the last completion: the engine's own report.
    fn finish(&mut self) -> Result<EngineReport, BenchError>;
}

/// The fsync (flush) latency of one disk.
#[derive(Clone, Debug, Default)]
pub struct FsyncBlock {
    /// Which disk (device and directory, or node and group).
    pub disk: String,
    /// Flushes (write + fdatasync) completed.
    pub flushes: u64,
    /// Latency percentiles, (percent, ns).
    pub percentiles_ns: Vec<(f64, u64)>,
    /// Mean latency, ns, where known.
    pub mean_ns: Option<f64>,
    /// Largest latency, ns, where known.
    pub max_ns: Option<u64>,
    /// Median records per flush (group commit), where known.
    pub records_per_flush_p50: Option<u64>,
    /// Mean bytes written per flush, padding included, where known: the
    /// `--bs` to give fio for the same bytes per fdatasync.
    pub bytes_per_flush: Option<u64>,
    /// Bytes written to the disk per second (headers and padding
    /// included) from the first write to the end, where known: the
    /// figure to set beside fio's at `--bs` = `bytes_per_flush`.
    pub disk_bytes_per_s: Option<f64>,
}

/// The transport's counters over a udp run.
#[derive(Clone, Debug, Default)]
pub struct TransportBlock {
    /// Datagrams the sender put on the wire.
    pub datagrams_sent: u64,
    /// Frames sent again after a NACK.
    pub rexmit_frames: u64,
    /// Bytes sent again.
    pub rexmit_bytes: u64,
    /// NACKs the sender received.
    pub nacks_received: u64,
    /// NACK rounds the receiver sent.
    pub nack_rounds: u64,
    /// Sends refused by a full window (retried).
    pub window_stalls: u64,
    /// Messages the receiver was told it will never get.
    pub skipped: u64,
    /// Loss asked for, percent.
    pub loss_percent: u32,
    /// Packets nftables dropped, where it could say.
    pub nft_dropped: Option<u64>,
}

/// A cluster's replication counters over a run (summed over nodes).
#[derive(Clone, Debug, Default)]
pub struct ClusterCounters {
    /// NACK rounds sent between nodes.
    pub nack_rounds: u64,
    /// Retransmitted frames, where the nodes report them.
    pub retransmits: Option<u64>,
    /// Datagrams sent between nodes.
    pub datagrams_sent: u64,
    /// Raft messages refused by a full transport window.
    pub sends_refused: u64,
    /// Times the term of the measured group moved on (a new leader).
    pub leader_changes: u64,
    /// Elections started.
    pub elections: u64,
    /// Leader of the measured group at the end.
    pub leader: Option<u64>,
    /// Datagrams dropped for a bad MAC or as malformed.
    pub bad_datagrams: u64,
}

/// CPU time over a stonewall group per operation its cluster jobs
/// confirmed (ramp included, as the CPU time is).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuBlock {
    /// Operations confirmed by the group's cluster jobs.
    pub ops: u64,
    /// The daemons' CPU time, user + system summed over them, µs; `None`
    /// when their PIDs are not known (not `--embedded`) or one went away.
    pub daemon_cpu_us: Option<u64>,
    /// How many daemons that sums.
    pub daemons: usize,
    /// quire-bench's own CPU time (every thread), µs.
    pub client_cpu_us: u64,
}

impl CpuBlock {
    /// The daemons' CPU µs per confirmed operation (`cpu_us_per_op`).
    pub fn cpu_us_per_op(&self) -> Option<f64> {
        let d = self.daemon_cpu_us?;
        (self.ops > 0).then(|| d as f64 / self.ops as f64)
    }

    /// quire-bench's CPU µs per confirmed operation (`client_cpu_us_per_op`).
    pub fn client_cpu_us_per_op(&self) -> Option<f64> {
        (self.ops > 0).then(|| self.client_cpu_us as f64 / self.ops as f64)
    }
}

/// What an engine adds to the report.
#[derive(Clone, Debug, Default)]
pub struct EngineReport {
    /// One block per disk.
    pub fsync: Vec<FsyncBlock>,
    /// udp engine only.
    pub transport: Option<TransportBlock>,
    /// cluster engine only.
    pub replication: Option<ClusterCounters>,
    /// cluster engine only: CPU per confirmed operation, over the job's
    /// stonewall group (filled in by the run, not the engine).
    pub cpu: Option<CpuBlock>,
    /// Facts worth a line (backend, O_DIRECT...).
    pub notes: Vec<String>,
    /// Block devices the engine's files live on (for the disk stats).
    pub devices: Vec<String>,
}

impl EngineReport {
    /// Adds another job's report.
    pub fn merge(&mut self, other: &EngineReport) {
        self.fsync.extend(other.fsync.iter().cloned());
        if let Some(t) = &other.transport {
            let mine = self.transport.get_or_insert_with(Default::default);
            mine.datagrams_sent += t.datagrams_sent;
            mine.rexmit_frames += t.rexmit_frames;
            mine.rexmit_bytes += t.rexmit_bytes;
            mine.nacks_received += t.nacks_received;
            mine.nack_rounds += t.nack_rounds;
            mine.window_stalls += t.window_stalls;
            mine.skipped += t.skipped;
            mine.loss_percent = t.loss_percent;
            mine.nft_dropped = match (mine.nft_dropped, t.nft_dropped) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        }
        if self.cpu.is_none() {
            // Group-wide, like the replication counters: keep one.
            self.cpu = other.cpu.clone();
        }
        if other.replication.is_some() && self.replication.is_none() {
            // Cluster counters are cluster-wide, not per job: keep one.
            self.replication = other.replication.clone();
        }
        for n in &other.notes {
            if !self.notes.contains(n) {
                self.notes.push(n.clone());
            }
        }
        for d in &other.devices {
            if !self.devices.contains(d) {
                self.devices.push(d.clone());
            }
        }
    }
}

/// Counts errors by kind (a helper for engines that report them).
pub type ErrorCounts = BTreeMap<String, u64>;
