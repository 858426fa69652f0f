//! The open-loop runner against a deliberately slow fake target, on a
//! virtual clock (no sleeps, no wall-clock assertions): with `rate_iops`
//! above what the target can serve, latency from the intended start grows
//! with the queue, far beyond the service time; below it, latency is the
//! service time; closed loop hides the queue entirely.

use quire::bench::engine::{Completion, Engine, EngineReport, Op};
use quire::bench::options::{JobOptions, RateProcess};
use quire::bench::runner::{run_job, Clock, Progress};
use quire::bench::stats::JobStats;
use quire::bench::BenchError;
use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Virtual time: moves only when the runner sleeps or the engine waits.
#[derive(Clone, Default)]
struct VirtualClock {
    now_ns: Rc<Cell<u64>>,
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.get()
    }
    fn sleep_until_ns(&self, t: u64) {
        self.now_ns.set(self.now_ns.get().max(t));
    }
    fn instant_ns(&self, _at: Instant) -> u64 {
        self.now_ns.get()
    }
}

/// One server, first come first served, a fixed service time per op.
struct SlowTarget {
    clock: VirtualClock,
    service_ns: u64,
    free_at_ns: u64,
    /// (finish time, op id), in finish order.
    queue: VecDeque<(u64, u64)>,
}

impl Engine for SlowTarget {
    fn submit(&mut self, op: Op, _done: &mut Vec<Completion>) -> Result<(), BenchError> {
        let begin = self.free_at_ns.max(self.clock.now_ns());
        self.free_at_ns = begin + self.service_ns;
        self.queue.push_back((self.free_at_ns, op.id));
        Ok(())
    }

    fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) -> Result<(), BenchError> {
        let limit = self.clock.now_ns() + timeout.as_nanos() as u64;
        match self.queue.front() {
            Some(&(t, _)) if t <= limit => {
                self.clock.sleep_until_ns(t);
                while let Some(&(t, id)) = self.queue.front() {
                    if t > self.clock.now_ns() {
                        break;
                    }
                    self.queue.pop_front();
                    done.push(Completion {
                        id,
                        result: Ok(1024),
                        finished: None,
                    });
                }
            }
            _ => self.clock.sleep_until_ns(limit),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<EngineReport, BenchError> {
        Ok(EngineReport::default())
    }
}

const SERVICE_NS: u64 = 4_000_000; // 4 ms: the target serves 250 ops/s

fn run(rate_iops: Option<u64>, iodepth: usize, ops: u64) -> JobStats {
    let clock = VirtualClock::default();
    let mut target = SlowTarget {
        clock: clock.clone(),
        service_ns: SERVICE_NS,
        free_at_ns: 0,
        queue: VecDeque::new(),
    };
    let job = JobOptions {
        name: "slow".into(),
        rate_iops,
        rate_process: RateProcess::Linear,
        iodepth,
        number_ios: Some(ops),
        ..JobOptions::default()
    };
    let (stats, _) = run_job(&job, 0, &mut target, &clock, &Progress::default()).expect("runs");
    assert_eq!(stats.write.ops, ops);
    stats
}

#[test]
fn saturated_open_loop_latency_includes_the_queueing_delay() {
    // 1000 ops/s offered to a 250 ops/s target: op k is meant to start at
    // k ms but is served at 4k ms, so it waits about 3k ms.
    let s = run(Some(1000), 1, 200);
    let lat = &s.write.lat;
    let clat = &s.write.clat;
    // Service alone is 4 ms, every time.
    assert_eq!(clat.max_ns(), SERVICE_NS);
    assert_eq!(clat.min_ns(), SERVICE_NS);
    // The last op waited behind 199 others: ~3 ms x 199 + 4 ms.
    assert!(lat.max_ns() >= 100 * SERVICE_NS, "lat max {}", lat.max_ns());
    assert!(
        lat.percentile_ns(50.0) >= 50 * SERVICE_NS,
        "p50 {}",
        lat.percentile_ns(50.0)
    );
    // The waiting shows in slat, and lat is slat + clat.
    assert!(s.write.slat.max_ns() + SERVICE_NS >= lat.max_ns());
    let expected_last = 199 * (SERVICE_NS - 1_000_000) + SERVICE_NS;
    assert!(
        lat.max_ns().abs_diff(expected_last) <= expected_last / 100,
        "lat max {} against the queueing model's {expected_last}",
        lat.max_ns()
    );
}

#[test]
fn deeper_queues_wait_the_same_under_open_loop() {
    // More in flight does not make a single server faster: the backlog,
    // and so the latency from the intended start, is the same.
    let shallow = run(Some(1000), 1, 200);
    let deep = run(Some(1000), 16, 200);
    let ratio = deep.write.lat.max_ns() as f64 / shallow.write.lat.max_ns() as f64;
    assert!((0.9..1.1).contains(&ratio), "ratio {ratio}");
    // With 16 in flight the wait moves from slat into clat (queued inside
    // the target), but lat still counts it.
    assert!(deep.write.clat.max_ns() > 10 * SERVICE_NS);
}

#[test]
fn below_capacity_latency_is_the_service_time() {
    let s = run(Some(100), 1, 100);
    assert_eq!(s.write.lat.max_ns(), SERVICE_NS);
}

#[test]
fn closed_loop_hides_the_queue() {
    // Without a rate the next op starts when a slot frees up: the same
    // slow target shows only its service time (coordinated omission).
    let s = run(None, 1, 200);
    assert_eq!(s.write.lat.max_ns(), SERVICE_NS);
}
