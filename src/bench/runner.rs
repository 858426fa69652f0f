//! The open-loop runner: keeps up to `iodepth` operations in flight on one
//! engine, paced by `rate_iops` when given, and accounts every completion.
//!
//! Under `rate_iops` each operation has an intended start time fixed by the
//! rate process, whether or not the target keeps up. Latency (`lat`) is
//! measured from that intended time, so when the target saturates, the
//! time an operation waited for a free slot counts (it shows in `slat`):
//! no coordinated omission. Without a rate the intended time is the moment
//! a slot became free (closed loop, as fio without `rate_iops`).
//!
//! The runner reads time only through [`Clock`], so a test can run it on a
//! virtual clock against a fake engine.

use super::engine::{Completion, Engine, EngineReport, Op, OpKind};
use super::error::BenchError;
use super::options::{JobOptions, RateProcess, Workload};
use super::stats::{DirStats, IntervalAccumulator, JobStats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The runner's time source.
pub trait Clock {
    /// Nanoseconds since the clock's epoch.
    fn now_ns(&self) -> u64;
    /// Blocks until `now_ns() >= t`.
    fn sleep_until_ns(&self, t: u64);
    /// `at` on this clock.
    fn instant_ns(&self, at: Instant) -> u64;
}

/// Wall-clock time (monotonic).
#[derive(Clone, Copy, Debug)]
pub struct RealClock {
    epoch: Instant,
}

impl RealClock {
    /// A clock whose epoch is now.
    pub fn new() -> RealClock {
        RealClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    fn sleep_until_ns(&self, t: u64) {
        let now = self.now_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
    }
    fn instant_ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }
}

/// Live counters of a running job, read by the progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Operations completed (ramp included).
    pub ops: AtomicU64,
    /// Bytes completed.
    pub bytes: AtomicU64,
    /// Operations failed.
    pub errors: AtomicU64,
}

/// The longest single wait, so the loop notices the end of the run and
/// interval boundaries promptly.
const POLL_SLICE: Duration = Duration::from_millis(50);

struct InFlight {
    intended_ns: u64,
    submitted_ns: u64,
    kind: OpKind,
    measured: bool,
}

/// Runs one job (one clone, `clone_index`) to the end against `engine`.
pub fn run_job(
    job: &JobOptions,
    clone_index: u64,
    engine: &mut dyn Engine,
    clock: &dyn Clock,
    progress: &Progress,
) -> Result<(JobStats, EngineReport), BenchError> {
    let mut rng =
        ChaCha8Rng::seed_from_u64(job.seed.wrapping_add(clone_index.wrapping_mul(0x9e37_79b9)));
    let start_ns = clock.now_ns();
    let measure_from_ns = start_ns + job.ramp_time.as_nanos() as u64;
    let end_ns = job.runtime.map(|r| measure_from_ns + r.as_nanos() as u64);
    let interval_ns = job.interval().as_nanos() as u64;
    // Stragglers completing after the runtime are recorded, but in the
    // last interval: the window (and the intervals) end with the runtime.
    let window_end_ns = end_ns.unwrap_or(u64::MAX);
    let gap = |rng: &mut ChaCha8Rng| -> u64 {
        let Some(rate) = job.rate_iops else { return 0 };
        let mean_ns = 1e9 / rate as f64;
        match job.rate_process {
            RateProcess::Linear => mean_ns as u64,
            RateProcess::Poisson => {
                // Exponential gaps: inverse transform of a uniform in (0, 1].
                let u: f64 = 1.0 - rng.gen::<f64>();
                (-u.ln() * mean_ns) as u64
            }
        }
    };
    let mut stats = JobStats::default();
    let mut interval = IntervalAccumulator::default();
    let mut next_interval_ns = measure_from_ns + interval_ns;
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let mut done: Vec<Completion> = Vec::new();
    let mut next_id = 0u64;
    let mut next_intended_ns = start_ns;
    let (mut issued_ops, mut issued_bytes) = (0u64, 0u64);
    let limit_reached = |ops: u64, bytes: u64| {
        !job.time_based
            && (job.number_ios.is_some_and(|n| ops >= n)
                || job.size_bytes.is_some_and(|s| bytes >= s))
    };
    loop {
        let now = clock.now_ns();
        let time_up = end_ns.is_some_and(|e| now >= e);
        let may_issue = !time_up && !limit_reached(issued_ops, issued_bytes);
        if !may_issue && in_flight.is_empty() && done.is_empty() {
            break;
        }
        while may_issue && in_flight.len() < job.iodepth && !limit_reached(issued_ops, issued_bytes)
        {
            let intended_ns = if job.rate_iops.is_some() {
                if next_intended_ns > now {
                    break;
                }
                let t = next_intended_ns;
                next_intended_ns += gap(&mut rng).max(1);
                t
            } else {
                now
            };
            let kind = match job.rw {
                Workload::Append | Workload::Produce | Workload::Ledger => OpKind::Write,
                Workload::Read | Workload::Tail | Workload::Consume => OpKind::Read,
                Workload::Mixed => {
                    if rng.gen_range(0..100) < job.rwmixwrite {
                        OpKind::Write
                    } else {
                        OpKind::Read
                    }
                }
            };
            let bytes = rng.gen_range(job.bs.min_bytes..=job.bs.max_bytes);
            let id = next_id;
            next_id += 1;
            let measured = intended_ns >= measure_from_ns;
            if measured {
                issued_ops += 1;
                issued_bytes += bytes;
            }
            // Stamped before the hand-over: an engine on other threads may
            // finish the operation before `submit` returns to this one.
            in_flight.insert(
                id,
                InFlight {
                    intended_ns,
                    submitted_ns: clock.now_ns(),
                    kind,
                    measured,
                },
            );
            engine.submit(
                Op {
                    id,
                    kind,
                    bytes: bytes as usize,
                },
                &mut done,
            )?;
        }
        if done.is_empty() {
            let now = clock.now_ns();
            let mut wake = now + POLL_SLICE.as_nanos() as u64;
            if let Some(e) = end_ns {
                wake = wake.min(e.max(now));
            }
            if job.rate_iops.is_some() && in_flight.len() < job.iodepth && may_issue {
                wake = wake.min(next_intended_ns.max(now));
            }
            if in_flight.is_empty() {
                clock.sleep_until_ns(wake);
            } else {
                engine.poll(Duration::from_nanos(wake - now), &mut done)?;
            }
        }
        let now = clock.now_ns();
        for c in done.drain(..) {
            let Some(f) = in_flight.remove(&c.id) else {
                return Err(BenchError::UnknownCompletion(c.id));
            };
            let submitted_ns = f.submitted_ns;
            let finished_ns = c
                .finished
                .map_or(now, |at| clock.instant_ns(at))
                .max(submitted_ns);
            match c.result {
                Ok(bytes) => {
                    progress.ops.fetch_add(1, Ordering::Relaxed);
                    progress.bytes.fetch_add(bytes, Ordering::Relaxed);
                    if !f.measured {
                        continue;
                    }
                    let (slat, clat, lat) = (
                        submitted_ns.saturating_sub(f.intended_ns),
                        finished_ns - submitted_ns,
                        finished_ns.saturating_sub(f.intended_ns),
                    );
                    let dir: &mut DirStats = match f.kind {
                        OpKind::Write => &mut stats.write,
                        OpKind::Read => &mut stats.read,
                    };
                    dir.ops += 1;
                    dir.bytes += bytes;
                    dir.slat.record(slat);
                    dir.clat.record(clat);
                    dir.lat.record(lat);
                    while finished_ns >= next_interval_ns && next_interval_ns <= window_end_ns {
                        stats
                            .intervals
                            .push(interval.close((next_interval_ns - measure_from_ns) / 1_000_000));
                        next_interval_ns += interval_ns;
                    }
                    interval.record(slat, clat, lat, bytes);
                }
                Err(kind) => {
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    if f.measured {
                        *stats.errors.entry(kind.to_string()).or_default() += 1;
                    }
                }
            }
        }
    }
    let end = clock.now_ns().max(measure_from_ns).min(window_end_ns);
    while end >= next_interval_ns {
        stats
            .intervals
            .push(interval.close((next_interval_ns - measure_from_ns) / 1_000_000));
        next_interval_ns += interval_ns;
    }
    if end > next_interval_ns - interval_ns {
        stats
            .intervals
            .push(interval.close((end - measure_from_ns) / 1_000_000));
    }
    // The window ends at `runtime` even when stragglers complete later:
    // their latency is recorded in full (a stuck operation must show), but
    // waiting for them is not run time, or one straggler would halve the
    // throughput.
    stats.runtime_ns = end - measure_from_ns;
    let report = engine.finish()?;
    Ok((stats, report))
}
