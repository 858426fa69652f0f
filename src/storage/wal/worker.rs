//! One background thread per log for the filesystem calls that must not
//! run on the loop: zero-filling a spare segment, fsyncing the directory
//! after a rename, unlinking an old snapshot file.
//!
//! A zero-fill is written a chunk at a time and the short jobs jump the
//! queue between chunks: the roll after a trim waits for the directory
//! fsync, and must not wait behind a segment's worth of zeros as well.
//! Dropping the worker abandons a zero-fill in progress (its temporary
//! file goes) and waits for the thread, so nothing writes into the log's
//! directory after the `Wal` is gone.
//!
//! A directory whose [`LogDir::jobs_inline`] says so (the simulator's)
//! gets no thread: each job runs when submitted, in order, so a run
//! replays from its seed.

use super::segments::segment_name;
use crate::buf::{AlignedBuf, IO_ALIGN_BYTES};
use crate::storage::dir::{LogDir, LogFile};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Names a job handed to the worker.
pub(super) type JobId = u64;

/// Bytes of zeros written between two looks at the job queue.
const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;

/// Work for the background thread.
pub(super) enum Job {
    /// Zero-fill segment `id` (`bytes` long) under a temporary name, sync
    /// it, rename it in and sync the directory.
    Preallocate {
        /// Segment number.
        id: u64,
        /// Its size.
        bytes: u64,
    },
    /// fsync the log directory (after a rename).
    SyncDir,
    /// Remove a file nothing depends on any more; reports no result.
    Unlink(String),
    /// Blocks the worker until the sender is dropped or sends (tests).
    #[cfg(test)]
    Gate(mpsc::Receiver<()>),
}

/// The log's handle on its background thread.
pub(super) struct Worker<D: LogDir> {
    /// Set when jobs run inline, on the caller's thread.
    inline: Option<D>,
    jobs: Option<mpsc::Sender<(JobId, Job)>>,
    done: mpsc::Receiver<Completion>,
    finished: BTreeMap<JobId, Completion>,
    next_id: JobId,
    thread: Option<JoinHandle<()>>,
}

/// A finished job.
pub(super) struct Completion {
    id: JobId,
    /// Position among the worker's completions (tests check the order).
    #[cfg_attr(not(test), allow(dead_code))]
    order: u64,
    result: io::Result<()>,
}

impl<D: LogDir> Worker<D> {
    /// Starts the thread for the log in `dir` (none if its jobs run inline).
    pub(super) fn start(dir: D) -> io::Result<Worker<D>> {
        let (jobs, inbox) = mpsc::channel();
        let (outbox, done) = mpsc::channel();
        if dir.jobs_inline() {
            return Ok(Worker {
                inline: Some(dir),
                jobs: None,
                done,
                finished: BTreeMap::new(),
                next_id: 1,
                thread: None,
            });
        }
        let thread = std::thread::Builder::new()
            .name("quire-wal".into())
            .spawn(move || run(&dir, &inbox, &outbox))?;
        Ok(Worker {
            inline: None,
            jobs: Some(jobs),
            done,
            finished: BTreeMap::new(),
            next_id: 1,
            thread: Some(thread),
        })
    }

    /// Queues a job; its result is collected with `poll` or `wait`.
    pub(super) fn submit(&mut self, job: Job) -> JobId {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(dir) = &self.inline {
            let result = match job {
                Job::Preallocate { id: segment, bytes } => preallocate(dir, segment, bytes),
                Job::SyncDir => dir.sync(),
                Job::Unlink(name) => {
                    let _ = dir.remove(&name);
                    return id;
                }
                #[cfg(test)]
                Job::Gate(_) => Ok(()),
            };
            let order = id;
            self.finished.insert(id, Completion { id, order, result });
            return id;
        }
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|j| j.send((id, job)).is_ok());
        if !sent {
            // The thread is gone (it panicked): say so to whoever waits.
            let result = Err(io::Error::other("the log's background thread stopped"));
            self.finished.insert(
                id,
                Completion {
                    id,
                    order: u64::MAX,
                    result,
                },
            );
        }
        id
    }

    /// The result of job `id` if it has finished (taken: asked once).
    pub(super) fn poll(&mut self, id: JobId) -> Option<io::Result<()>> {
        while let Ok(c) = self.done.try_recv() {
            self.finished.insert(c.id, c);
        }
        self.finished.remove(&id).map(|c| c.result)
    }

    /// Records job `id` as finished with `result` (tests: a job held back).
    #[cfg(test)]
    pub(super) fn complete(&mut self, id: JobId, result: io::Result<()>) {
        let order = u64::MAX;
        self.finished.insert(id, Completion { id, order, result });
    }

    /// An id no job has: finished only by `complete` (tests).
    #[cfg(test)]
    pub(super) fn reserve(&mut self) -> JobId {
        self.next_id += 1;
        self.next_id - 1
    }

    /// Waits for job `id` and returns its result.
    pub(super) fn wait(&mut self, id: JobId) -> io::Result<()> {
        self.wait_completion(id).result
    }

    /// Waits for job `id` and returns how it finished.
    fn wait_completion(&mut self, id: JobId) -> Completion {
        loop {
            if let Some(c) = self.finished.remove(&id) {
                return c;
            }
            match self.done.recv() {
                Ok(c) => {
                    self.finished.insert(c.id, c);
                }
                Err(_) => {
                    return Completion {
                        id,
                        order: u64::MAX,
                        result: Err(io::Error::other("the log's background thread stopped")),
                    }
                }
            }
        }
    }
}

impl<D: LogDir> Drop for Worker<D> {
    fn drop(&mut self) {
        self.jobs = None; // the thread sees the queue close and ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A zero-fill in progress.
struct Fill<F> {
    id: JobId,
    segment: u64,
    tmp: String,
    file: F,
    written: u64,
    bytes: u64,
}

fn run<D: LogDir>(
    dir: &D,
    inbox: &mpsc::Receiver<(JobId, Job)>,
    outbox: &mpsc::Sender<Completion>,
) {
    let zeros = AlignedBuf::zeroed(ZERO_FILL_CHUNK_BYTES);
    let zeros = zeros.as_slice();
    let mut order = 0;
    let mut report = |id: JobId, result: io::Result<()>| {
        order += 1;
        let _ = outbox.send(Completion { id, order, result });
    };
    let mut fill: Option<Fill<D::File>> = None;
    let mut waiting: VecDeque<(JobId, u64, u64)> = VecDeque::new();
    loop {
        // Short jobs first; block only when there is nothing to fill.
        let next = if fill.is_none() && waiting.is_empty() {
            match inbox.recv() {
                Ok(job) => Some(job),
                Err(_) => break,
            }
        } else {
            match inbox.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
        };
        if let Some((id, job)) = next {
            match job {
                Job::Preallocate { id: segment, bytes } => waiting.push_back((id, segment, bytes)),
                Job::SyncDir => report(id, dir.sync()),
                Job::Unlink(name) => {
                    let _ = dir.remove(&name);
                }
                #[cfg(test)]
                Job::Gate(gate) => {
                    let _ = gate.recv();
                    report(id, Ok(()));
                }
            }
            continue;
        }
        if fill.is_none() {
            let Some((id, segment, bytes)) = waiting.pop_front() else {
                continue;
            };
            match start_fill(dir, id, segment, bytes) {
                Ok(f) => fill = Some(f),
                Err(e) => report(id, Err(e)),
            }
            continue;
        }
        let f = fill.as_mut().expect("checked above");
        match step_fill(dir, f, zeros) {
            Ok(false) => {}
            Ok(true) => {
                let f = fill.take().expect("checked above");
                report(f.id, Ok(()));
            }
            Err(e) => {
                let f = fill.take().expect("checked above");
                let _ = dir.remove(&f.tmp);
                report(f.id, Err(e));
            }
        }
    }
    // The log is gone: a zero-fill in progress is abandoned.
    if let Some(f) = fill {
        let _ = dir.remove(&f.tmp);
    }
}

/// Zero-fills segment `id` now, on the calling thread (when no spare is
/// ready and one is needed at once), as a background `Preallocate` does.
pub(super) fn preallocate<D: LogDir>(dir: &D, id: u64, bytes: u64) -> io::Result<()> {
    let zeros = AlignedBuf::zeroed(ZERO_FILL_CHUNK_BYTES);
    let mut f = start_fill(dir, 0, id, bytes)?;
    loop {
        match step_fill(dir, &mut f, zeros.as_slice()) {
            Ok(false) => {}
            Ok(true) => return Ok(()),
            Err(e) => {
                let _ = dir.remove(&f.tmp);
                return Err(e);
            }
        }
    }
}

fn start_fill<D: LogDir>(
    dir: &D,
    id: JobId,
    segment: u64,
    bytes: u64,
) -> io::Result<Fill<D::File>> {
    let tmp = format!("{}.tmp", segment_name(segment));
    // Zeros written through the page cache cost a copy and a page-cache
    // churn per byte of log: 6.5% of all CPU at 140k appends/s of 1 KiB
    // (bench/README.md). O_DIRECT, where every chunk is block-aligned.
    let file = if bytes % IO_ALIGN_BYTES as u64 == 0 {
        dir.create_new_direct(&tmp)?.0
    } else {
        dir.create_new(&tmp)?
    };
    Ok(Fill {
        id,
        segment,
        tmp,
        file,
        written: 0,
        bytes,
    })
}

/// Writes the next chunk; true once the segment is in place and durable.
fn step_fill<D: LogDir>(dir: &D, f: &mut Fill<D::File>, zeros: &[u8]) -> io::Result<bool> {
    if f.written < f.bytes {
        let n = (f.bytes - f.written).min(zeros.len() as u64) as usize;
        f.file.write_at(&zeros[..n], f.written)?;
        f.written += n as u64;
        return Ok(false);
    }
    f.file.sync_all()?;
    dir.rename(&f.tmp, &segment_name(f.segment))?;
    dir.sync()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::dir::OsDir;
    use std::fs;

    #[test]
    fn a_zero_fill_leaves_a_zeroed_segment_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Worker::start(OsDir::new(dir.path())).unwrap();
        let bytes = 3 * ZERO_FILL_CHUNK_BYTES as u64 + 4096;
        let id = w.submit(Job::Preallocate { id: 7, bytes });
        w.wait(id).unwrap();
        let data = fs::read(dir.path().join(segment_name(7))).unwrap();
        assert_eq!(data.len() as u64, bytes);
        assert!(data.iter().all(|&b| b == 0));
        assert!(!dir.path().join("0000000000000007.seg.tmp").exists());
        assert!(w.poll(id).is_none(), "a result is taken once");
    }

    #[test]
    fn a_directory_sync_overtakes_a_zero_fill() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Worker::start(OsDir::new(dir.path())).unwrap();
        let (open, gate) = mpsc::channel();
        let held = w.submit(Job::Gate(gate));
        let bytes = 8 * ZERO_FILL_CHUNK_BYTES as u64;
        let fill = w.submit(Job::Preallocate { id: 1, bytes });
        let sync = w.submit(Job::SyncDir);
        open.send(()).unwrap();
        let gate_done = w.wait_completion(held).order;
        let sync_done = w.wait_completion(sync).order;
        let fill_done = w.wait_completion(fill);
        fill_done.result.unwrap();
        assert!(gate_done < sync_done && sync_done < fill_done.order);
    }

    #[test]
    fn dropping_the_worker_abandons_a_zero_fill_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Worker::start(OsDir::new(dir.path())).unwrap();
        let (_open, gate) = mpsc::channel::<()>();
        w.submit(Job::Gate(gate));
        w.submit(Job::Preallocate {
            id: 1,
            bytes: 64 * ZERO_FILL_CHUNK_BYTES as u64,
        });
        drop(_open); // the gate opens as the worker is dropped
        drop(w);
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert!(
            left.iter().all(|e| {
                let name = e.as_ref().unwrap().file_name();
                !name.to_string_lossy().ends_with(".seg.tmp")
            }),
            "a temporary file was left"
        );
    }
}
