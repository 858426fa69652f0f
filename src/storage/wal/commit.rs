//! Group commit: batches cut from appends, tickets, flushes in flight, durability
//! reported in ticket order, and stall detection.

use super::*;
use crate::consensus::{Entry, HardState, Index, Term};
use crate::io::{AlignedBuf, IoCompletion, IoOp, IoRequest};
use crate::storage::format::{BatchBuilder, Placement};
use crate::storage::recovery::BatchLocation;
use std::io::{self};
use std::time::Duration;

pub(super) struct InFlight {
    /// The sequence number of the batch it writes, if it writes one.
    pub(super) seq: Option<u64>,
    /// When it was submitted (µs on the directory's clock).
    pub(super) submitted_us: u64,
    pub(super) last: Option<(Index, Term)>,
    pub(super) records: u64,
    pub(super) bytes: u64,
    pub(super) stalled: bool,
    pub(super) done: bool,
    pub(super) result: Option<io::Error>,
    pub(super) latency: Duration,
}

pub(super) struct Sealed {
    pub(super) ticket: Ticket,
    pub(super) batch: BatchBuilder,
}

/// Bytes an entry takes in a batch besides its `size_bytes` (record
/// header and padding), counted when deciding where a batch is cut.
pub(super) const ENTRY_DISK_OVERHEAD_BYTES: usize = 64;

impl<D: LogDir> Wal<D> {
    /// Queues entries from a `Ready`: everything at or after
    /// `truncate_from` is replaced first. Returns the ticket to wait for.
    pub fn append(
        &mut self,
        truncate_from: Option<Index>,
        entries: &[Entry],
    ) -> Result<Ticket, WalError> {
        self.check_not_failed()?;
        self.check_entry_sizes(entries)?;
        let Some(first) = entries.first() else {
            if let Some(t) = truncate_from {
                self.start_batch_at(t);
            }
            return Ok(self.current_ticket());
        };
        let from = truncate_from.unwrap_or(first.index);
        assert_eq!(from, first.index, "entries start where the truncation does");
        assert!(
            from > self.snapshot_index && from <= self.last.0 + 1,
            "appends are consecutive"
        );
        if from <= self.last.0 {
            self.start_batch_at(from);
        }
        for e in entries {
            // An entry that would take the open batch past
            // `flush_bytes_max` seals it first, and one larger than that
            // starts a batch of its own (which it fills, so it is sealed
            // below): a batch is then at most `flush_bytes_max`, or one
            // large entry (bounded by `entry_bytes_max`, so it fits a
            // segment). So a batch fits its pooled buffer: one that grew
            // was not kept, and a leader's batches of many records each
            // (an entry of 100+ KiB) allocated fresh, page-faulting
            // buffers for every flush (37% of all samples).
            let entry_bytes = e.size_bytes() + ENTRY_DISK_OVERHEAD_BYTES;
            let overflows = self.open_batch.as_ref().is_some_and(|b| {
                b.batch.count() > 0 && b.batch.disk_bytes() + entry_bytes > self.cfg.flush_bytes_max
            });
            if overflows {
                let b = self.open_batch.take().expect("just checked");
                self.sealed.push_back(b);
            }
            let batch = self.batch_for_append(e.index);
            batch.batch.push(e);
            let full = batch.batch.disk_bytes() >= self.cfg.flush_bytes_max;
            if full {
                let b = self.open_batch.take().expect("just used");
                self.sealed.push_back(b);
            }
            self.last = (e.index, e.term);
        }
        Ok(self.current_ticket())
    }

    /// The largest entry (payload bytes) this log stores: half a segment,
    /// so that a batch holding it alone, with its headers and padding,
    /// always fits an empty segment. An entry larger than
    /// `flush_bytes_max` takes a flush of its own.
    pub fn entry_bytes_max(&self) -> usize {
        entry_bytes_max(&self.cfg)
    }

    /// Refuses entries larger than `entry_bytes_max` (before anything
    /// of the call is queued: a refused call changes nothing).
    pub(super) fn check_entry_sizes(&self, entries: &[Entry]) -> Result<(), WalError> {
        let max = self.entry_bytes_max();
        match entries.iter().find(|e| e.size_bytes() > max) {
            Some(e) => Err(WalError::Invalid(format!(
                "entry {} is {} bytes, more than this log's entry_bytes_max ({max}, half of segment_bytes)",
                e.index,
                e.size_bytes(),
            ))),
            None => Ok(()),
        }
    }

    /// Records the hard state of a `Ready`. A new term or vote must be
    /// durable before dependent messages leave, so it joins the next flush;
    /// a commit index alone rides in the next batch header.
    pub fn set_hard_state(&mut self, hs: HardState) -> Result<Ticket, WalError> {
        self.check_not_failed()?;
        self.commit = self.commit.max(hs.commit);
        let changed = hs.term != self.hard_state.term || hs.vote != self.hard_state.vote;
        self.hard_state = HardState {
            commit: self.commit,
            ..hs
        };
        if changed {
            self.sb_dirty = true;
            if self.open_batch.is_none() && self.sealed.is_empty() {
                let at = self.last.0 + 1;
                let ticket = self.take_ticket();
                let batch = self.new_batch(at);
                self.open_batch = Some(Sealed { ticket, batch });
            }
        }
        Ok(self.current_ticket())
    }

    /// Refuses new client appends while the disk is full or failed.
    pub fn admit(&mut self) -> Result<(), WalError> {
        self.check_not_failed()?;
        if self.state == DiskState::Full {
            // Space may have returned: the waiting batch retries a segment.
            self.submit_ready()?;
        }
        if self.state == DiskState::Full {
            self.metrics.disk_full_refusals += 1;
            return Err(WalError::DiskFull);
        }
        Ok(())
    }

    pub(super) fn check_not_failed(&self) -> Result<(), WalError> {
        match &self.state {
            DiskState::Failed(why) => Err(WalError::Stopped(why.clone())),
            _ => Ok(()),
        }
    }

    pub(super) fn take_ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// The ticket covering everything queued so far.
    pub fn current_ticket(&self) -> Ticket {
        self.next_ticket - 1
    }

    /// The lowest ticket whose batch is queued and not yet handed to the
    /// device (a simulator's oracle: tickets below it and below the
    /// device's oldest unsynced request are durable).
    pub fn oldest_unsubmitted_ticket(&self) -> Option<Ticket> {
        let sealed = self.sealed.front().map(|s| s.ticket);
        let open = self.open_batch.as_ref().map(|s| s.ticket);
        sealed.into_iter().chain(open).min()
    }

    pub(super) fn start_batch_at(&mut self, first_index: Index) {
        if let Some(b) = self.open_batch.take() {
            self.sealed.push_back(b);
        }
        let ticket = self.take_ticket();
        let batch = self.new_batch(first_index);
        self.open_batch = Some(Sealed { ticket, batch });
        // Cached reads of the replaced suffix are stale now.
        self.uncache_from(first_index);
        self.last = (first_index - 1, self.last.1);
    }

    /// A batch built in a recycled buffer when one is free.
    pub(super) fn new_batch(&mut self, first_index: Index) -> BatchBuilder {
        let buf = self
            .buf_pool
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(self.cfg.flush_bytes_max + (64 << 10)));
        BatchBuilder::with_buffer(first_index, buf)
    }

    /// Keeps a few batch-sized buffers for reuse.
    pub(super) fn recycle(&mut self, bufs: Vec<AlignedBuf>) {
        for b in bufs {
            // A buffer grown for one large entry is not kept: the pool
            // holds batch-sized buffers only.
            let batch_sized = b.capacity() >= self.cfg.flush_bytes_max
                && b.capacity() <= 2 * self.cfg.flush_bytes_max + (64 << 10);
            if batch_sized && self.buf_pool.len() < 8 {
                self.buf_pool.push(b);
            }
        }
    }

    pub(super) fn batch_for_append(&mut self, index: Index) -> &mut Sealed {
        if self.open_batch.is_none() {
            let ticket = self.take_ticket();
            let batch = self.new_batch(index);
            self.open_batch = Some(Sealed { ticket, batch });
        }
        self.open_batch.as_mut().expect("just ensured")
    }

    /// Submits what group commit allows and collects finished flushes,
    /// without blocking. Call after every `Ready` and on every wake-up.
    pub fn poll(&mut self) -> Result<(), WalError> {
        self.reap(false)?;
        self.finish_adoption()?;
        self.collect_spare(false)?;
        self.top_up_spares();
        self.submit_ready()?;
        self.check_stall();
        Ok(())
    }

    /// Blocks until at least one flush finishes (if any is in flight),
    /// then submits what may go next.
    pub fn wait(&mut self) -> Result<(), WalError> {
        self.submit_ready()?;
        self.reap(true)?;
        self.submit_ready()
    }

    /// Flushes everything queued and waits until it is durable.
    pub fn sync(&mut self) -> Result<(), WalError> {
        let target = self.current_ticket();
        while self.durable_ticket < target {
            self.check_not_failed()?;
            self.submit_ready()?; // also retries a segment when full
            if self.state == DiskState::Full && self.backend.in_flight() == 0 {
                return Err(WalError::DiskFull);
            }
            self.wait()?;
        }
        self.check_not_failed()?;
        self.finish_adoption()
    }

    pub(super) fn submit_ready(&mut self) -> Result<(), WalError> {
        if matches!(self.state, DiskState::Failed(_)) {
            return Ok(());
        }
        loop {
            let in_flight = self.in_flight.len();
            if in_flight >= self.cfg.flushes_in_flight_max as usize {
                return Ok(());
            }
            // A sealed (full) batch may go while another flush runs; the
            // open one waits for the disk to be idle, gathering more.
            let next = if !self.sealed.is_empty() {
                self.sealed.pop_front()
            } else if in_flight == 0 && (self.open_batch.is_some() || self.sb_dirty) {
                self.open_batch.take().or_else(|| {
                    let at = self.last.0 + 1;
                    let ticket = self.take_ticket();
                    let batch = self.new_batch(at);
                    Some(Sealed { ticket, batch })
                })
            } else {
                None
            };
            let Some(s) = next else {
                return Ok(());
            };
            match self.submit_flush(s) {
                Ok(Ok(())) => {}
                Ok(Err(back)) => {
                    self.sealed.push_front(back); // no room yet: retried later
                    return Ok(());
                }
                Err(e) => {
                    // The batch is gone with the error: a later flush
                    // completing would report its entries durable, never
                    // written. So the log stops here, as after a failed
                    // flush (an I/O error preparing a segment is the
                    // disk's too).
                    self.metrics.io_errors += 1;
                    self.state = DiskState::Failed(format!("{e}"));
                    return Err(e);
                }
            }
        }
    }

    /// Submits one flush; gives the batch back if no segment has room.
    pub(super) fn submit_flush(&mut self, s: Sealed) -> Result<Result<(), Sealed>, WalError> {
        let empty = s.batch.count() == 0;
        let mut ops = Vec::with_capacity(4);
        let mut loc = None;
        let (last, records) = (s.batch.last(), s.batch.count() as u64);
        let mut bytes = 0u64;
        // An empty batch still records a truncation if it starts inside the
        // log; one that only carries the superblock is skipped.
        let writes_batch = !empty || s.batch.first_index() <= self.durable_end();
        if writes_batch {
            let len = s.batch.disk_bytes() as u64;
            if self.append_offset + len > self.cfg.segment_bytes && !self.roll_segment()? {
                return Ok(Err(s));
            }
            let first_index = s.batch.first_index();
            let seq = self.next_seq;
            self.next_seq += 1;
            let place = Placement {
                segment: self.active,
                recycled: self.active_recycled,
            };
            let data = s.batch.finish(seq, self.commit, place);
            let fd = self.segments[&self.active].fd();
            let l = BatchLocation {
                segment: self.active,
                offset: self.append_offset,
                disk_bytes: len,
                seq,
                first_index,
                count: records,
                recycled: self.active_recycled,
            };
            // A batch past the segment's end would lie outside what the
            // recovery scan reads.
            assert!(
                self.append_offset + len <= self.cfg.segment_bytes,
                "a {len}-byte batch at offset {} overruns segment {}",
                self.append_offset,
                self.active
            );
            self.append_offset += len;
            bytes = len;
            loc = Some(l);
            if self.sb_dirty {
                self.push_superblock_ops(&mut ops);
            }
            ops.push(IoOp::Write {
                fd,
                offset: l.offset,
                buf: data,
            });
            ops.push(IoOp::Fdatasync { fd });
        } else if self.sb_dirty {
            self.push_superblock_ops(&mut ops);
        } else {
            // Nothing to write: the ticket is durable once earlier ones are.
            self.in_flight
                .insert(s.ticket, InFlight::done_now(last, self.dir.now_us()));
            self.advance_durable();
            return Ok(Ok(()));
        }
        if let Some(l) = loc {
            self.note_batch_location(l);
        }
        self.backend
            .submit(IoRequest {
                token: s.ticket,
                ops,
            })
            .map_err(io_err("submitting a flush"))?;
        self.in_flight.insert(
            s.ticket,
            InFlight {
                seq: loc.map(|l| l.seq),
                submitted_us: self.dir.now_us(),
                last,
                records,
                bytes,
                stalled: false,
                done: false,
                result: None,
                latency: Duration::ZERO,
            },
        );
        Ok(Ok(()))
    }

    pub(super) fn durable_end(&self) -> Index {
        self.last.0.max(self.durable.0)
    }

    pub(super) fn push_superblock_ops(&mut self, ops: &mut Vec<IoOp>) {
        self.sb.seq += 1;
        self.sb.hard_state = HardState {
            commit: self.commit,
            ..self.hard_state
        };
        let fd = self.sb_file.fd();
        ops.push(IoOp::Write {
            fd,
            offset: self.sb.slot_offset(),
            buf: AlignedBuf::from_slice(&self.sb.encode()),
        });
        ops.push(IoOp::Fdatasync { fd });
        self.sb_dirty = false;
    }
}

impl<D: LogDir> Wal<D> {
    pub(super) fn reap(&mut self, wait: bool) -> Result<(), WalError> {
        let mut done: Vec<IoCompletion> = Vec::new();
        self.backend
            .reap(wait, &mut done)
            .map_err(io_err("collecting completions"))?;
        for c in done {
            // Anything else is `run_now`'s, which is not waiting here.
            let _ = self.note_done(c);
        }
        self.advance_durable();
        self.check_not_failed()
    }

    /// Records a completed flush (its latency on the directory's clock,
    /// its result, its buffers back in the pool); gives back a completion
    /// that is not a flush.
    pub(super) fn note_flush_done(&mut self, c: IoCompletion) -> Option<IoCompletion> {
        let now_us = self.dir.now_us();
        let Some(f) = self.in_flight.get_mut(&c.token) else {
            return Some(c);
        };
        f.done = true;
        f.latency = Duration::from_micros(now_us.saturating_sub(f.submitted_us));
        if let Err(e) = c.result {
            f.result = Some(e);
        }
        self.recycle(c.bufs);
        None
    }

    /// Durability is reported in ticket order: a later flush completing
    /// first does not make earlier ones durable.
    pub(super) fn advance_durable(&mut self) {
        // After a failed flush nothing is durable again in this life: a
        // later flush that succeeded holds batches written after the lost
        // one, and reporting it would confirm the lost entries too.
        if matches!(self.state, DiskState::Failed(_)) {
            return;
        }
        while let Some((&t, f)) = self.in_flight.first_key_value() {
            if !f.done {
                break;
            }
            let f = self.in_flight.remove(&t).expect("present");
            if let Some(e) = f.result {
                // Never retried: after a failed fsync the kernel may have
                // dropped the dirty pages, so a retry could report success
                // for data that is gone.
                self.metrics.io_errors += 1;
                self.state = DiskState::Failed(format!("flush {t} failed: {e}"));
                return;
            }
            if f.bytes > 0 || f.records > 0 {
                self.metrics.flushes += 1;
                self.metrics.records += f.records;
                self.metrics.bytes += f.bytes;
                let us = f.latency.as_micros() as u64;
                let _ = self.metrics.flush_latency_us.record(us.max(1));
                let _ = self.metrics.records_per_flush.record(f.records.max(1));
                let _ = self.metrics.bytes_per_flush.record(f.bytes.max(1));
            }
            // Durability is reported in ticket order, each ticket once: a
            // ticket reported twice or backwards would confirm writes early.
            assert!(
                t > self.durable_ticket,
                "ticket {t} durable after {}",
                self.durable_ticket
            );
            self.durable_ticket = t;
            if let Some(seq) = f.seq {
                self.durable_seq = seq;
            }
            if let Some(last) = f.last {
                self.note_durable(last);
            }
        }
        if self.state == DiskState::Degraded && self.in_flight.values().all(|f| !f.stalled) {
            self.state = DiskState::Healthy;
        }
    }

    /// The log is durable up to `last`; a repair it reaches is done (the
    /// superblock stops recording it with the next flush).
    pub(super) fn note_durable(&mut self, last: (Index, Term)) {
        self.durable = last;
        if self.sb.repair_until != 0 && last.0 >= self.sb.repair_until {
            self.sb.repair_until = 0;
            self.sb_dirty = true;
        }
    }

    /// A flush outstanding for longer than `disk_stall_ms` marks the disk
    /// degraded (counted once per flush) until no stalled flush remains.
    pub(super) fn check_stall(&mut self) {
        let now_us = self.dir.now_us();
        let limit = Duration::from_millis(self.cfg.disk_stall_ms);
        let mut newly = 0;
        for f in self.in_flight.values_mut() {
            let waited = Duration::from_micros(now_us.saturating_sub(f.submitted_us));
            if !f.done && !f.stalled && waited >= limit {
                f.stalled = true;
                newly += 1;
            }
        }
        if newly > 0 {
            self.metrics.stalls += newly;
            if self.state == DiskState::Healthy {
                self.state = DiskState::Degraded;
            }
        }
    }
}

impl<D: LogDir> Wal<D> {
    pub(super) fn write_superblock_now(&mut self) -> Result<(), WalError> {
        let mut ops = Vec::new();
        self.sb_dirty = true;
        self.push_superblock_ops(&mut ops);
        self.run_now(ops).map(|_| ())
    }
}

impl InFlight {
    pub(super) fn done_now(last: Option<(Index, Term)>, now_us: u64) -> Self {
        InFlight {
            seq: None,
            submitted_us: now_us,
            last,
            records: 0,
            bytes: 0,
            stalled: false,
            done: true,
            result: None,
            latency: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests;
