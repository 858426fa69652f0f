//! The simulator's host for a production replica (and the replica's unit
//! tests'): a clock that moves when its driver sets it, seeds from a
//! counter, and offloaded jobs that wait in a queue until the driver runs
//! them (or the replica waits for one, which runs it at once), so the
//! driver, not a thread scheduler, decides when a snapshot is written and
//! adopted.

use crate::node::loops::host::{Host, JobState, Offloaded};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// The names of the jobs that run at once: a scrub read
/// (`node::replica::scrub`), a chunk of a snapshot image read for a
/// follower or staged from the leader (`node::replica::snapshot`).
const AT_ONCE_JOB_PREFIXES: [&str; 3] = ["quire-scrub-", "quire-image-", "quire-stage-"];

/// A driver's host; clones share the clock and the queue.
#[derive(Clone, Default)]
pub(crate) struct ManualHost {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    now_us: u64,
    seeds: u64,
    queue: VecDeque<(String, Arc<dyn Run>)>,
}

/// A queued job, whatever its result type.
trait Run: Send + Sync {
    /// Runs it unless it ran already.
    fn run(&self);
}

/// A job and, once it ran, its result.
struct Job<T> {
    slot: Mutex<Slot<T>>,
}

enum Slot<T> {
    Queued(Box<dyn FnOnce() -> T + Send>),
    Done(T),
    Taken,
}

impl<T: Send> Run for Job<T> {
    fn run(&self) {
        let mut slot = self.slot.lock().expect("job slot");
        if let Slot::Queued(job) = std::mem::replace(&mut *slot, Slot::Taken) {
            *slot = Slot::Done(job());
        }
    }
}

impl<T: Send> Job<T> {
    fn take(&self) -> JobState<T> {
        let mut slot = self.slot.lock().expect("job slot");
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Done(v) => JobState::Done(v),
            Slot::Taken => JobState::Lost,
            queued @ Slot::Queued(_) => {
                *slot = queued;
                JobState::Running
            }
        }
    }
}

struct Handle<T>(Arc<Job<T>>);

impl<T: Send> Offloaded<T> for Handle<T> {
    fn try_take(&mut self) -> JobState<T> {
        self.0.take()
    }

    fn wait(self: Box<Self>) -> Option<T> {
        self.0.run();
        match self.0.take() {
            JobState::Done(v) => Some(v),
            JobState::Running | JobState::Lost => None,
        }
    }
}

impl ManualHost {
    /// A host whose seeds follow from `seed` (a simulator's).
    pub(crate) fn seeded(seed: u64) -> Self {
        let host = ManualHost::default();
        host.inner.lock().expect("host").seeds = seed;
        host
    }

    /// Sets the clock.
    pub(crate) fn set_now_us(&self, now_us: u64) {
        self.inner.lock().expect("host").now_us = now_us;
    }

    /// The names of the jobs offloaded and not run yet, oldest first.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> Vec<String> {
        let inner = self.inner.lock().expect("host");
        inner.queue.iter().map(|(name, _)| name.clone()).collect()
    }

    /// True if a job waits to be run.
    pub(crate) fn has_queued(&self) -> bool {
        !self.inner.lock().expect("host").queue.is_empty()
    }

    /// Runs the oldest queued job; its name, or `None` if none waits.
    pub(crate) fn run_next(&self) -> Option<String> {
        let (name, job) = self.inner.lock().expect("host").queue.pop_front()?;
        job.run();
        Some(name)
    }
}

impl Host for ManualHost {
    fn now_us(&self) -> u64 {
        self.inner.lock().expect("host").now_us
    }

    fn seed(&self) -> u64 {
        let mut inner = self.inner.lock().expect("host");
        // splitmix64: distinct, well-mixed seeds from a counter.
        inner.seeds = inner.seeds.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = inner.seeds;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn offload<T: Send + 'static>(
        &self,
        name: String,
        _low_priority: bool,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Box<dyn Offloaded<T>>> {
        let job = Arc::new(Job {
            slot: Mutex::new(Slot::Queued(Box::new(job))),
        });
        let queued: Arc<dyn Run> = job.clone();
        // A scrub read runs at once: it only reads, and in this one queue
        // it would hold back the snapshot jobs behind it, which threads of
        // their own on a real host do not. So do an image's chunks, one
        // job per chunk each side: queued at the seeded delays, a transfer
        // of a few hundred chunks would outlast the faults between them.
        if AT_ONCE_JOB_PREFIXES.iter().any(|p| name.starts_with(p)) {
            queued.run();
            return Ok(Box::new(Handle(job)));
        }
        self.inner
            .lock()
            .expect("host")
            .queue
            .push_back((name, queued));
        Ok(Box::new(Handle(job)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_when_the_test_says_or_when_waited_for() {
        let host = ManualHost::default();
        let mut a = host.offload("a".into(), true, || 1).expect("queued");
        let b = host.offload("b".into(), false, || 2).expect("queued");
        assert_eq!(host.queued(), ["a", "b"]);
        assert_eq!(a.try_take(), JobState::Running);
        assert_eq!(host.run_next().as_deref(), Some("a"));
        assert_eq!(a.try_take(), JobState::Done(1));
        assert_eq!(a.try_take(), JobState::Lost);
        // Waiting runs it at once; the queue's turn then does nothing.
        assert_eq!(b.wait(), Some(2));
        assert_eq!(host.run_next().as_deref(), Some("b"));
        assert_eq!(host.run_next(), None);
        host.set_now_us(7);
        assert_eq!(host.now_us(), 7);
        assert_ne!(host.seed(), host.seed());
    }
}
