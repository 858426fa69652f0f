//! Latency and throughput accounting: HdrHistogram for percentiles, exact
//! running sums for min, max, mean and standard deviation (the histogram's
//! buckets would round them), and per-interval samples for the logs and
//! the plot. Pure: the caller passes every time in.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Highest latency recorded exactly, ns (an hour); longer ones are clamped.
pub const LATENCY_NS_MAX: u64 = 3_600_000_000_000;

/// One latency distribution, in nanoseconds.
#[derive(Clone, Debug)]
pub struct LatencyStats {
    hist: Histogram<u64>,
    count: u64,
    min_ns: u64,
    max_ns: u64,
    sum_ns: f64,
    sum_sq_ns: f64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        LatencyStats {
            // 3 significant figures: percentiles within 0.1 %.
            hist: Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid bounds"),
            count: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            sum_ns: 0.0,
            sum_sq_ns: 0.0,
        }
    }
}

impl LatencyStats {
    /// Records one latency.
    pub fn record(&mut self, ns: u64) {
        let ns = ns.clamp(1, LATENCY_NS_MAX);
        self.hist.saturating_record(ns);
        self.count += 1;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.sum_ns += ns as f64;
        self.sum_sq_ns += (ns as f64) * (ns as f64);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyStats) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.hist.add(&other.hist);
        self.count += other.count;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        self.sum_ns += other.sum_ns;
        self.sum_sq_ns += other.sum_sq_ns;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Smallest sample (0 when empty).
    pub fn min_ns(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min_ns
        }
    }

    /// Largest sample.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Mean (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns / self.count as f64
        }
    }

    /// Population standard deviation, as fio prints.
    pub fn stdev_ns(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let mean = self.mean_ns();
        (self.sum_sq_ns / self.count as f64 - mean * mean)
            .max(0.0)
            .sqrt()
    }

    /// The value at percentile `p` (0 < p <= 100): the smallest recorded
    /// value with at least p % of the samples at or below it, to the
    /// histogram's precision (0.1 %).
    pub fn percentile_ns(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        // The histogram answers with the top of a bucket; the exact maximum
        // is known, so never report beyond it.
        self.hist.value_at_percentile(p).min(self.max_ns)
    }
}

/// The statistics of one direction (writes or reads) of a job.
#[derive(Clone, Debug, Default)]
pub struct DirStats {
    /// Operations completed without error.
    pub ops: u64,
    /// Bytes of those operations.
    pub bytes: u64,
    /// Intended start to handed to the engine (includes the wait for a
    /// free slot when the target is saturated under `rate_iops`).
    pub slat: LatencyStats,
    /// Handed to the engine to completion.
    pub clat: LatencyStats,
    /// Intended start to completion: what a client of an open system sees.
    pub lat: LatencyStats,
}

impl DirStats {
    /// Adds `other` into this.
    pub fn merge(&mut self, other: &DirStats) {
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.slat.merge(&other.slat);
        self.clat.merge(&other.clat);
        self.lat.merge(&other.lat);
    }
}

/// What one interval of a run saw (for `write_lat_log` and the plot).
#[derive(Clone, Debug, Default)]
pub struct IntervalSample {
    /// End of the interval, ms since the measured run started.
    pub end_ms: u64,
    /// Operations completed in it.
    pub ops: u64,
    /// Bytes completed in it.
    pub bytes: u64,
    /// Mean lat, clat and slat in it, ns.
    pub lat_mean_ns: f64,
    /// Mean clat in it, ns.
    pub clat_mean_ns: f64,
    /// Mean slat in it, ns.
    pub slat_mean_ns: f64,
    /// lat percentiles in it: p50, p99, max, ns.
    pub lat_p50_ns: u64,
    /// p99 of lat in it, ns.
    pub lat_p99_ns: u64,
    /// Largest lat in it, ns.
    pub lat_max_ns: u64,
}

/// Everything a job (or a group of jobs) measured.
#[derive(Clone, Debug, Default)]
pub struct JobStats {
    /// Appends, produces.
    pub write: DirStats,
    /// Reads, tails, consumes.
    pub read: DirStats,
    /// Failed operations by kind of error.
    pub errors: BTreeMap<String, u64>,
    /// Per-interval samples.
    pub intervals: Vec<IntervalSample>,
    /// Measured time, ns (after the ramp).
    pub runtime_ns: u64,
}

impl JobStats {
    /// Adds `other` (another job of the group) into this. Intervals are
    /// summed position by position (the jobs ran side by side).
    pub fn merge(&mut self, other: &JobStats) {
        self.write.merge(&other.write);
        self.read.merge(&other.read);
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self.runtime_ns = self.runtime_ns.max(other.runtime_ns);
        for (i, s) in other.intervals.iter().enumerate() {
            match self.intervals.get_mut(i) {
                Some(mine) => {
                    let total = mine.ops + s.ops;
                    let w = |a: f64, b: f64| {
                        if total == 0 {
                            0.0
                        } else {
                            (a * mine.ops as f64 + b * s.ops as f64) / total as f64
                        }
                    };
                    mine.lat_mean_ns = w(mine.lat_mean_ns, s.lat_mean_ns);
                    mine.clat_mean_ns = w(mine.clat_mean_ns, s.clat_mean_ns);
                    mine.slat_mean_ns = w(mine.slat_mean_ns, s.slat_mean_ns);
                    // Percentiles do not add; the worse of the two is what
                    // a stall looks like, which is what the plot is for.
                    mine.lat_p50_ns = mine.lat_p50_ns.max(s.lat_p50_ns);
                    mine.lat_p99_ns = mine.lat_p99_ns.max(s.lat_p99_ns);
                    mine.lat_max_ns = mine.lat_max_ns.max(s.lat_max_ns);
                    mine.ops = total;
                    mine.bytes += s.bytes;
                }
                None => self.intervals.push(s.clone()),
            }
        }
    }

    /// Total failed operations.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Collects one interval's samples until it is closed.
#[derive(Debug, Default)]
pub struct IntervalAccumulator {
    lat: LatencyStats,
    clat_sum_ns: f64,
    slat_sum_ns: f64,
    bytes: u64,
}

impl IntervalAccumulator {
    /// Records one completed operation.
    pub fn record(&mut self, slat_ns: u64, clat_ns: u64, lat_ns: u64, bytes: u64) {
        self.lat.record(lat_ns);
        self.clat_sum_ns += clat_ns as f64;
        self.slat_sum_ns += slat_ns as f64;
        self.bytes += bytes;
    }

    /// Closes the interval ending at `end_ms` and starts the next.
    pub fn close(&mut self, end_ms: u64) -> IntervalSample {
        let n = self.lat.count();
        let per = |sum: f64| if n == 0 { 0.0 } else { sum / n as f64 };
        let s = IntervalSample {
            end_ms,
            ops: n,
            bytes: self.bytes,
            lat_mean_ns: self.lat.mean_ns(),
            clat_mean_ns: per(self.clat_sum_ns),
            slat_mean_ns: per(self.slat_sum_ns),
            lat_p50_ns: self.lat.percentile_ns(50.0),
            lat_p99_ns: self.lat.percentile_ns(99.0),
            lat_max_ns: self.lat.max_ns(),
        };
        *self = IntervalAccumulator::default();
        s
    }
}
