//! What a node takes from its process besides its logs and sockets: a
//! clock, helper threads and randomness. A replica reaches them only
//! through [`Host`], so that a driver other than the daemon (the
//! simulator, a unit test) supplies its own: a virtual clock, jobs run
//! when it says, seeds from its RNG. [`OsHost`] is the process's: the
//! monotonic clock, one named thread per job at the lowest priority when
//! asked, `/dev/urandom`.
//!
//! Never here: the log (the WAL is the replica's, and its own seam is
//! under it) and the wall clock stamped on ledger and queue commands (the
//! caller passes it, as it passes the loop's clock).

use crossbeam_channel::{bounded, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

/// What a replica needs from its process besides its log.
pub(crate) trait Host: 'static {
    /// Monotonic µs from an arbitrary origin, for what the replica
    /// measures (a snapshot's capture and adoption times); never for a
    /// decision, which runs on the loop's clock passed in as `now_ms`.
    fn now_us(&self) -> u64;

    /// A fresh seed for what must differ at every start (election jitter,
    /// the phase of the snapshot interval).
    fn seed(&self) -> u64;

    /// Runs `job` off the loop: `name` names it (a thread's name), and a
    /// `low_priority` job must leave the CPU and the disk to the loops.
    /// Its result is taken from the handle (`Offloaded`); dropping the
    /// handle does not stop the job. An error: it could not be started.
    fn offload<T: Send + 'static>(
        &self,
        name: String,
        low_priority: bool,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Box<dyn Offloaded<T>>>;
}

/// A job handed to [`Host::offload`].
pub(crate) trait Offloaded<T> {
    /// Its result if it finished, without waiting.
    fn try_take(&mut self) -> JobState<T>;

    /// Waits for its result; `None` if it ended without one.
    fn wait(self: Box<Self>) -> Option<T>;
}

/// Where an offloaded job is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum JobState<T> {
    /// Not finished yet.
    Running,
    /// Finished, with its result (taken: asked again, it is `Lost`).
    Done(T),
    /// Ended without a result (its thread panicked).
    Lost,
}

/// The process as a replica's host: `Instant`, threads, the OS's random
/// source (`crate::entropy`).
#[derive(Clone)]
pub(crate) struct OsHost {
    origin: Instant,
    /// Called when an offloaded job ends.
    wake: WakeLoop,
    /// Seeds: 64 random bits drawn at `new`, stepped by splitmix64 (one
    /// draw per host instead of a syscall per seed; the seeds only need
    /// to differ and be unpredictable from outside).
    seeds: Arc<std::sync::atomic::AtomicU64>,
}

/// Wakes a loop (its eventfd); called on a job's thread once the job's
/// result is in, or once the job panicked.
pub(crate) type WakeLoop = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for OsHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OsHost")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl OsHost {
    /// A host whose clock starts now and whose jobs call `wake` as they
    /// end: otherwise a result would wait for the loop's next turn, up
    /// to 10 ms when nothing else wakes it (an image transfer, a read
    /// and a stage per chunk, spent most of its time there).
    /// Refused if the OS's random source cannot be read (its seeds
    /// would be guessable).
    pub(crate) fn new(wake: WakeLoop) -> Result<Self, crate::entropy::EntropyError> {
        Ok(OsHost {
            origin: Instant::now(),
            wake,
            seeds: Arc::new(std::sync::atomic::AtomicU64::new(
                crate::entropy::random_u64()?,
            )),
        })
    }
}

/// Wakes the loop when dropped: at a job's end, panic or not.
struct WakeOnDrop(WakeLoop);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        (self.0)();
    }
}

impl Host for OsHost {
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn seed(&self) -> u64 {
        // splitmix64: each call a distinct, well-mixed value.
        let golden = 0x9e37_79b9_7f4a_7c15;
        let mut z = self
            .seeds
            .fetch_add(golden, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(golden);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn offload<T: Send + 'static>(
        &self,
        name: String,
        low_priority: bool,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Box<dyn Offloaded<T>>> {
        let (tx, done) = bounded(1);
        let wake = Arc::clone(&self.wake);
        std::thread::Builder::new().name(name).spawn(move || {
            // Declared first, so dropped last: the wake comes after the
            // result is sent, or after the sender is gone (a panic: the
            // loop sees the job lost at once).
            let _wake = WakeOnDrop(wake);
            let tx = tx;
            // Here, not in the job: a simulator runs the job on its own
            // thread, whose priority it must keep.
            if low_priority {
                lower_priority();
            }
            let _ = tx.send(job());
        })?;
        Ok(Box::new(Thread(done)))
    }
}

/// A job on a thread of its own: its result comes over a channel.
struct Thread<T>(Receiver<T>);

impl<T> Offloaded<T> for Thread<T> {
    fn try_take(&mut self) -> JobState<T> {
        match self.0.try_recv() {
            Ok(v) => JobState::Done(v),
            Err(TryRecvError::Empty) => JobState::Running,
            Err(TryRecvError::Disconnected) => JobState::Lost,
        }
    }

    fn wait(self: Box<Self>) -> Option<T> {
        self.0.recv().ok()
    }
}

/// Makes the calling (helper) thread yield the CPU and the disk to the
/// event loops: the idle scheduling class (on Linux a thread's own) and
/// the lowest best-effort I/O priority. Best effort: a refusal
/// leaves the thread as it was.
fn lower_priority() {
    // SAFETY: setpriority and ioprio_set on the calling thread (who = 0)
    // take plain integers.
    unsafe {
        // SCHED_IDLE: runs only on a core nothing else wants, and any
        // waking loop thread preempts it at once (nice 19 as a fallback).
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_BE: libc::c_long = 2;
        const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
        let lowest_best_effort = IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT | 7;
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            lowest_best_effort,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::loops::waker::Waker;

    /// A finished job wakes its loop (the eventfd becomes readable), and
    /// its result is there when the loop looks.
    #[test]
    fn a_finished_job_wakes_the_loop_with_its_result_in() {
        let waker = Waker::new().unwrap();
        let w = waker.clone();
        let host = OsHost::new(Arc::new(move || w.wake())).unwrap();
        let (release, hold) = bounded::<()>(1);
        let mut job = host
            .offload("test-job".into(), false, move || {
                hold.recv().unwrap();
                42
            })
            .unwrap();
        let readable = |timeout_ms: i32| {
            let mut fd = libc::pollfd {
                fd: waker.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut fd, 1, timeout_ms) == 1 }
        };
        assert!(!readable(0), "no wake before the job ends");
        assert_eq!(job.try_take(), JobState::Running);
        release.send(()).unwrap();
        assert!(readable(10_000), "the job's end woke the loop");
        assert_eq!(job.try_take(), JobState::Done(42));
        // A job that panics wakes the loop too, and is seen lost then.
        waker.drain();
        let mut job = host
            .offload("test-panic".into(), false, || -> u32 {
                panic!("a job that panics (expected by this test)")
            })
            .unwrap();
        assert!(readable(10_000), "the panicked job woke the loop");
        assert_eq!(job.try_take(), JobState::Lost);
    }
}
