//! `ioengine=wal`: the storage path alone. Each job opens its own
//! `storage::Wal` in `directory/quire-bench.NAME.N` and appends one entry
//! per operation; completions come from the WAL's durable index, so with
//! `iodepth` > 1 the appends in flight share fdatasyncs (real group commit,
//! as a node does). As in `examples/wal_bench.rs`, the log is compacted
//! behind the writer once per segment written, the steady state of a node
//! that snapshots, so a long run does not fill the disk.

use super::engine::{Completion, Engine, EngineReport, FsyncBlock, Op, OpKind};
use super::error::{BenchError, OpError};
use super::host;
use super::options::JobOptions;
use crate::consensus::{Entry, Membership, Payload, Snapshot};
use crate::storage::{Wal, WalConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Records written before a read workload starts, when it has nothing to read.
const PREFILL_RECORDS: u64 = 1024;

/// Segments laid out before timing (the ring compaction and recycling
/// keep the log in, as `examples/wal_bench` does).
const SEGMENTS_PREPARED: u32 = 4;

/// The wal engine of one job clone.
pub struct WalEngine {
    wal: Wal,
    dir: PathBuf,
    /// Appends not yet durable: (log index, op id, bytes), in index order.
    pending: VecDeque<(u64, u64, u64)>,
    next_index: u64,
    /// Lowest index still in the log (compaction drops the ones below).
    oldest_index: u64,
    trimmed_at_bytes: u64,
    segment_bytes: u64,
    rng: ChaCha8Rng,
    percentiles: Vec<f64>,
    device: Option<String>,
    /// When the first append was handed over, and the log's bytes then.
    first_write: Option<(std::time::Instant, u64)>,
}

impl WalEngine {
    /// Opens a fresh log for clone `clone_index` of `job`.
    pub fn open(job: &JobOptions, clone_index: u64) -> Result<WalEngine, BenchError> {
        let base = job
            .directory
            .as_ref()
            .ok_or_else(|| BenchError::usage("ioengine=wal needs --directory"))?;
        crate::io::private::create_dir_all(base)
            .map_err(BenchError::io(base.display().to_string()))?;
        let dir = base.join(format!("quire-bench.{}.{clone_index}", sanitize(&job.name)));
        // Only the directory this engine names for itself is cleared.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(BenchError::io(format!("clearing {}", dir.display())))?;
        }
        let cfg = WalConfig {
            segment_bytes: job.wal_segment_bytes,
            segments_recycled_max: 4,
            ..WalConfig::default()
        };
        if job.bs.max_bytes as usize + 64 > cfg.flush_bytes_max {
            return Err(BenchError::usage(format!(
                "bs {} is larger than the WAL's flush_bytes_max ({})",
                job.bs.max_bytes, cfg.flush_bytes_max
            )));
        }
        let (wal, _report) = Wal::open(&dir, cfg).map_err(BenchError::wal(format!(
            "opening a log in {}",
            dir.display()
        )))?;
        let mut engine = WalEngine {
            wal,
            device: host::device_of(base),
            dir,
            pending: VecDeque::new(),
            next_index: 1,
            oldest_index: 1,
            trimmed_at_bytes: 0,
            segment_bytes: job.wal_segment_bytes,
            rng: ChaCha8Rng::seed_from_u64(job.seed),
            percentiles: job.percentile_list.clone(),
            first_write: None,
        };
        // Lay out segments before timing, as a node that has run a while
        // has them (recycled): zero-filling them while timing would
        // write every byte twice and measure the layout, not the log.
        engine
            .wal
            .prepare_segments(SEGMENTS_PREPARED)
            .map_err(BenchError::wal(format!(
                "laying out segments in {}",
                engine.dir.display()
            )))?;
        if job.rw != super::options::Workload::Append {
            engine.prefill(job.bs.max_bytes as usize)?;
        }
        Ok(engine)
    }

    fn prefill(&mut self, bytes: usize) -> Result<(), BenchError> {
        for _ in 0..PREFILL_RECORDS {
            self.append(bytes)?;
        }
        self.wal.sync().map_err(BenchError::wal("prefilling"))
    }

    fn append(&mut self, bytes: usize) -> Result<u64, BenchError> {
        let index = self.next_index;
        let e = Entry {
            term: 1,
            index,
            payload: Payload::Normal(vec![0xa5; bytes].into()),
        };
        self.wal
            .append(None, std::slice::from_ref(&e))
            .map_err(BenchError::wal("append"))?;
        self.next_index += 1;
        Ok(index)
    }

    fn complete_durable(&mut self, done: &mut Vec<Completion>) {
        let durable = self.wal.durable().0;
        while self.pending.front().is_some_and(|(i, _, _)| *i <= durable) {
            let (_, id, bytes) = self.pending.pop_front().expect("checked");
            done.push(Completion {
                id,
                result: Ok(bytes),
                finished: None,
            });
        }
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

impl Engine for WalEngine {
    fn submit(&mut self, op: Op, done: &mut Vec<Completion>) -> Result<(), BenchError> {
        match op.kind {
            OpKind::Write => {
                if self.first_write.is_none() {
                    self.first_write = Some((std::time::Instant::now(), self.wal.metrics().bytes));
                }
                let index = self.append(op.bytes)?;
                self.pending.push_back((index, op.id, op.bytes as u64));
            }
            OpKind::Read => {
                let durable = self.wal.durable().0;
                if durable < self.oldest_index {
                    done.push(Completion {
                        id: op.id,
                        result: Err(OpError::NothingDurable),
                        finished: None,
                    });
                    return Ok(());
                }
                let index = self.rng.gen_range(self.oldest_index..=durable);
                let result = match self.wal.read(index, index) {
                    Ok(entries) => Ok(entries
                        .iter()
                        .map(|e| match &e.payload {
                            Payload::Normal(d) => d.len() as u64,
                            _ => 0,
                        })
                        .sum()),
                    Err(e) => Err(OpError::WalRead(Arc::new(e))),
                };
                done.push(Completion {
                    id: op.id,
                    result,
                    finished: None,
                });
            }
        }
        Ok(())
    }

    fn poll(&mut self, _timeout: Duration, done: &mut Vec<Completion>) -> Result<(), BenchError> {
        self.wal.poll().map_err(BenchError::wal("wal"))?;
        self.complete_durable(done);
        if done.is_empty() && !self.pending.is_empty() {
            // Blocks until a flush completes: bounded by one fdatasync, so
            // the timeout is not honoured exactly; a flush is the unit of
            // progress here anyway.
            self.wal.wait().map_err(BenchError::wal("wal"))?;
            self.complete_durable(done);
        }
        if self.wal.metrics().bytes - self.trimmed_at_bytes >= self.segment_bytes {
            // A snapshot at the durable index frees whole segments behind it.
            self.trimmed_at_bytes = self.wal.metrics().bytes;
            let snap = Snapshot {
                index: self.wal.durable().0,
                term: 1,
                membership: Membership::with_voters([1]),
                data: Vec::new(),
            };
            self.wal
                .compact(&snap)
                .map_err(BenchError::wal("compact"))?;
            self.oldest_index = snap.index + 1;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<EngineReport, BenchError> {
        self.wal.sync().map_err(BenchError::wal("wal"))?;
        let m = self.wal.metrics();
        let h = &m.flush_latency_us;
        let disk = match &self.device {
            Some(d) => format!("{d} ({})", self.dir.display()),
            None => self.dir.display().to_string(),
        };
        let block = FsyncBlock {
            disk,
            flushes: m.flushes,
            percentiles_ns: self
                .percentiles
                .iter()
                .map(|&p| (p, h.value_at_percentile(p) * 1000))
                .collect(),
            mean_ns: Some(h.mean() * 1000.0),
            max_ns: Some(h.max() * 1000),
            records_per_flush_p50: Some(m.records_per_flush.value_at_quantile(0.5)),
            bytes_per_flush: Some(m.bytes / m.flushes.max(1)),
            disk_bytes_per_s: self
                .first_write
                .map(|(at, bytes)| (m.bytes - bytes) as f64 / at.elapsed().as_secs_f64().max(1e-9)),
        };
        let report = EngineReport {
            fsync: vec![block],
            notes: vec![format!(
                "wal: {} backend, {}",
                self.wal.backend_name(),
                if self.wal.direct_io() {
                    "O_DIRECT"
                } else {
                    "buffered"
                }
            )],
            devices: self.device.iter().cloned().collect(),
            ..EngineReport::default()
        };
        // The log's spare-segment thread may still be writing there.
        let _ = self.wal.quiesce();
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(report)
    }
}
