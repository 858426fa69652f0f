//! Reads by index: the batch index (where each batch of the log lives), the
//! read cache, and reads on other threads from located batches.

use super::*;
use crate::consensus::{Entry, Index};
use crate::io::{AlignedBuf, IoOp, IoRequest};
use crate::storage::format::{align_up, decode_batch};
use crate::storage::recovery::BatchLocation;

impl<D: LogDir> Wal<D> {
    /// Keeps the index in log order: a batch replaces everything from its
    /// first index on.
    pub(super) fn note_batch_location(&mut self, l: BatchLocation) {
        while let Some(b) = self.index.last_mut() {
            if b.first_index >= l.first_index {
                self.index.pop();
            } else {
                b.count = b.count.min(l.first_index - b.first_index);
                break;
            }
        }
        if l.count > 0 {
            self.index.push(l);
        }
    }
}

impl<D: LogDir> Wal<D> {
    /// The batch holding entry `index`, if the log has it.
    pub(super) fn batch_at(&self, index: Index) -> Option<BatchLocation> {
        let pos = self.index.partition_point(|b| b.first_index <= index);
        let loc = self.index[pos.checked_sub(1)?];
        (index < loc.first_index + loc.count).then_some(loc)
    }

    pub(super) fn batch_at_or_err(&self, index: Index) -> Result<BatchLocation, WalError> {
        self.batch_at(index)
            .ok_or_else(|| WalError::Invalid(format!("index {index} is not in the log")))
    }

    /// True if the log holds entry `index` in a batch it can read.
    pub fn holds(&self, index: Index) -> bool {
        self.batch_at(index).is_some()
    }

    /// Where the durable entries `lo..=hi` are: each batch's segment file
    /// and place, for [`read_located`] to read them on another thread.
    pub fn locate(&self, lo: Index, hi: Index) -> Result<Vec<(String, BatchLocation)>, WalError> {
        if hi > self.durable.0 {
            return Err(WalError::Invalid(format!("index {hi} is not durable")));
        }
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            let loc = self.batch_at_or_err(i)?;
            out.push((segment_name(loc.segment), loc));
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    /// The directory the log is in (a reader on another thread opens the
    /// files [`Wal::locate`] names in a clone of it).
    pub fn dir(&self) -> &D {
        &self.dir
    }

    /// Entries `lo..=hi` that are durable, read from the segments through
    /// the backend (with a small cache of recently read batches).
    pub fn read(&mut self, lo: Index, hi: Index) -> Result<Vec<Entry>, WalError> {
        let hi = hi.min(self.durable.0);
        let mut out = Vec::new();
        let mut i = lo;
        while i <= hi {
            let loc = self.batch_at_or_err(i)?;
            let entries = self.read_batch(loc)?;
            for e in entries.iter().filter(|e| e.index >= i && e.index <= hi) {
                out.push(e.clone());
            }
            i = loc.first_index + loc.count;
        }
        Ok(out)
    }

    /// Runs a request and waits for it, handling other completions.
    pub(super) fn run_now(&mut self, ops: Vec<IoOp>) -> Result<Vec<AlignedBuf>, WalError> {
        const TOKEN: u64 = u64::MAX;
        self.backend
            .submit(IoRequest { token: TOKEN, ops })
            .map_err(io_err("submitting a request"))?;
        loop {
            let mut done = Vec::new();
            self.backend
                .reap(true, &mut done)
                .map_err(io_err("collecting completions"))?;
            let mut mine = None;
            for c in done {
                if let Some(c) = self.note_flush_done(c) {
                    mine = mine.or((c.token == TOKEN).then_some(c));
                }
            }
            self.advance_durable();
            if let Some(c) = mine {
                return match c.result {
                    Ok(()) => Ok(c.bufs),
                    Err(e) => {
                        self.metrics.io_errors += 1;
                        self.state = DiskState::Failed(format!("{e}"));
                        Err(WalError::Stopped(format!("{e}")))
                    }
                };
            }
        }
    }

    pub(super) fn read_batch(&mut self, loc: BatchLocation) -> Result<Vec<Entry>, WalError> {
        if let Some((_, e)) = self.cache.iter().find(|(l, _)| *l == loc) {
            return Ok(e.clone());
        }
        let fd = self.segments[&loc.segment].fd();
        let len = align_up(loc.disk_bytes as usize);
        let bufs = self.run_now(vec![IoOp::Read {
            fd,
            offset: loc.offset,
            len,
        }])?;
        let batch = decode_batch(bufs[0].as_slice()).map_err(|e| {
            WalError::Corrupt(format!(
                "segment {} offset {}: {e} while reading entries from {}",
                loc.segment, loc.offset, loc.first_index
            ))
        })?;
        let mut entries = batch.entries;
        entries.truncate(loc.count as usize);
        self.cache_bytes += loc.disk_bytes as usize;
        self.cache.push_back((loc, entries.clone()));
        while self.cache_bytes > self.cfg.read_cache_bytes {
            match self.cache.pop_front() {
                Some((l, _)) => self.cache_bytes -= l.disk_bytes as usize,
                None => break,
            }
        }
        Ok(entries)
    }
}

/// Reads the entries `lo..=hi` from the batches [`Wal::locate`] named in
/// `dir` (the log's, or a clone of it), with plain reads, on any thread.
/// A batch that no longer holds what was located (its segment was trimmed
/// and reused meanwhile) is an error, never other entries.
pub fn read_located<D: LogDir>(
    dir: &D,
    located: &[(String, BatchLocation)],
    lo: Index,
    hi: Index,
) -> Result<Vec<Entry>, WalError> {
    let mut out = Vec::new();
    let mut open: Option<(&str, D::File)> = None;
    for (name, loc) in located {
        if open.as_ref().is_none_or(|(n, _)| n != name) {
            let f = dir
                .open_existing(name)
                .map_err(io_err(format!("opening {name} in {}", dir.describe())))?;
            open = Some((name, f));
        }
        let (_, f) = open.as_ref().expect("just opened");
        let mut buf = vec![0u8; loc.disk_bytes as usize];
        f.read_at(&mut buf, loc.offset)
            .map_err(io_err(format!("reading {name} in {}", dir.describe())))?;
        let moved = || {
            WalError::Corrupt(format!(
                "segment {} offset {} no longer holds entries from {}",
                loc.segment, loc.offset, loc.first_index
            ))
        };
        let batch = decode_batch(&buf).map_err(|_| moved())?;
        if (batch.seq, batch.first_index, batch.place.segment)
            != (loc.seq, loc.first_index, loc.segment)
        {
            return Err(moved());
        }
        let end = loc.first_index + loc.count;
        out.extend(
            batch
                .entries
                .into_iter()
                .filter(|e| e.index >= lo && e.index <= hi && e.index < end),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_durably, entry, indexes, small_cfg};
    use super::*;

    #[test]
    fn reads_span_batches_and_segments_and_come_from_the_cache_again() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 50);
        assert!(wal.segments.len() > 1, "the test wants several segments");
        let all = wal.read(1, 50).unwrap();
        assert_eq!(all, (1..=50).map(entry).collect::<Vec<_>>());
        assert!(wal.cache_bytes > 0 && wal.cache_bytes <= wal.cfg.read_cache_bytes);
        assert_eq!(indexes(&wal.read(20, 22).unwrap()), [20, 21, 22]);
        // Reads stop at what is durable; below the log is an error.
        assert_eq!(indexes(&wal.read(49, 51).unwrap()), [49, 50]);
        let err = wal.read(0, 2).expect_err("0 is not in the log");
        assert!(matches!(err, WalError::Invalid(_)), "{err}");
    }

    #[test]
    fn located_batches_are_read_on_another_thread_and_a_reused_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
        append_durably(&mut wal, 30);
        let located = wal.locate(5, 25).unwrap();
        let read = std::thread::spawn({
            let (located, dir) = (located.clone(), wal.dir().clone());
            move || read_located(&dir, &located, 5, 25)
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(indexes(&read), (5..=25).collect::<Vec<_>>());
        // The same place holding another batch (a reused segment) is
        // refused, never read as other entries.
        let (name, mut loc) = located[0].clone();
        loc.seq += 1000;
        let err = read_located(wal.dir(), &[(name, loc)], 5, 25).expect_err("refused");
        assert!(matches!(err, WalError::Corrupt(_)), "{err}");
    }
}
