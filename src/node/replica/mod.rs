//! One group's replica on this node: its Raft core and its log, joined by
//! the `Ready` contract (consensus/mod.rs): write what Ready asks, send its
//! `messages` at once and its `messages_after_persist` only once the WAL
//! reports everything queued before them durable, report durability back
//! with `persisted`, apply what is committed.
//!
//! This file is that contract: the replica's state, `drive` (the Ready
//! loop, run every turn), `write`, `pump` (WAL completions reported to
//! Raft as durability, held messages released once their ticket is
//! durable), the disk-stall view and `stop`. The replica's other jobs each
//! have a file of their own, `impl Replica` blocks over the one struct
//! (its fields are private to this directory):
//!
//! - `machine`: the replicated state-machine policy: proposals and their
//!   encodings, apply (the dedup of client retries, the applied hash, the
//!   ledgers and queues), the restore from a snapshot's data, and the log
//!   entries the state refers to;
//! - `snapshot`: the snapshot pipeline: when one is due, the capture on
//!   the loop, encoding and writing off it, adoption once the log is
//!   durable up to it, and images for a follower behind the trimmed log;
//! - `reads`: linearizable reads (read-index rounds) and what waits for
//!   an entry: tails of the raw log and ledger long polls;
//! - `leadership`: what a leader that stops leading answers at once, and
//!   an operator's leadership transfer;
//! - `cold`: answers waiting for the bytes they carry to be read back
//!   from the segments (cold reads on the ring, never a wait on the loop);
//! - `repair`: entries below the snapshot that the state refers to and
//!   this log lost, fetched from peers, checked, stored, then served;
//! - `scrub`: the background read that checks every batch the log keeps
//!   and sends what it finds damaged below the snapshot to `repair`.

mod cold;
mod gather;
mod leadership;
mod machine;
mod planted;
mod reads;
mod repair;
mod scrub;
mod snapshot;
pub(crate) mod tap;
#[cfg(test)]
mod tests;

pub(crate) use machine::payload_at;
pub use machine::LEARNER_CAUGHT_UP_ENTRIES_MAX;

use crate::consensus::{Entry, Index, Message, NodeId, Raft, RestoredState, Role, Term};
use crate::heartbeat::GroupStatus;
use crate::node::command::{ProposeError, QueryReply};
use crate::node::errors::StartError;
use crate::node::log::log_error;
use crate::node::log::log_warn;
use crate::node::loops::host::{Host, OsHost};
use crate::node::spec::{GroupSpec, NodeSpec, SpecError};
use crate::node::status::{GroupView, SnapshotStats, WalView};
use crate::state::dedup::DedupTable;
use crate::state::{Query, StateMachine};
use crate::storage::{DiskState, LogDir, OsDir, Ticket, Wal, WalError};
use crate::transport::GroupId;
use machine::Waiter;
use reads::LinearRead;
use snapshot::{ImageReadJob, SnapshotJob, SnapshotWritten, StageJob};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
pub(crate) use tap::MissingFound;
use tap::{GlueBug, Note, WorkloadBug};

/// The largest entry payload a group proposes: one its log stores (the
/// WAL's limit counts the entry's header too) and one AppendEntries
/// message of at most `message_bytes_max` carries (with the envelope byte).
fn entry_bytes_max<D: LogDir>(wal: &Wal<D>, message_bytes_max: usize) -> usize {
    let stored = wal
        .entry_bytes_max()
        .saturating_sub(crate::consensus::ENTRY_OVERHEAD_BYTES);
    let carried = message_bytes_max
        .saturating_sub(1 + crate::transport::raft_codec::APPEND_OVERHEAD_BYTES_MAX);
    stored.min(carried)
}

/// One group on this node.
///
/// Generic over its log's directory (`D`: a real one, or a simulated
/// device's) and its host (`H`: clock, helper jobs, seeds); the daemon
/// leaves both at their defaults, the simulator supplies its own.
pub(crate) struct Replica<D: LogDir = OsDir, H: Host = OsHost> {
    pub(crate) group: GroupId,
    pub(crate) raft: Raft,
    pub(crate) wal: Wal<D>,
    /// The process around it: every clock read, helper job and seed.
    host: H,
    /// Messages that leave once the ticket is durable.
    held: VecDeque<(Ticket, Vec<Message>)>,
    /// What was last reported to Raft as persisted.
    reported: (Index, Term),
    /// Applied state: the index and a running hash of applied data.
    pub(crate) applied: Index,
    pub(crate) applied_hash: u64,
    /// Client appends applied, for idempotent retries.
    dedup: DedupTable,
    /// Addresses of client records the dedup table did not apply (a retry
    /// of an applied append is proposed again, so the log holds it twice):
    /// reads skip them as they skip no-ops, so a record is read once.
    /// Rebuilt by replay after a restart (apply is deterministic) and
    /// pruned below the snapshot (those entries are no longer readable).
    not_applied: BTreeSet<u64>,
    /// The ledgers and queues, applied from committed command entries.
    pub(crate) machine: StateMachine,
    waiters: BTreeMap<Index, Waiter>,
    /// The term this replica led at the last `drive` (`None`: it did not
    /// lead): when that changes, what clients wait on here is answered
    /// (`answer_lost_leadership`).
    led_term: Option<Term>,
    /// While leading, the node a leadership transfer goes to, if one is
    /// on: the hint for the clients sent on if the transfer ends this
    /// leadership before the new leader is heard from.
    transfer_target: Option<NodeId>,
    /// Client requests answered because this replica stopped leading.
    pub(crate) step_down_answers: u64,
    /// An operator's leadership transfer: to whom, the term it was asked
    /// in, and who waits for its outcome (`settle_transfer`).
    transfer_asked: Option<(NodeId, Term, crate::node::command::Reply)>,
    /// Client appends gathered since the last `drive`, for one client
    /// batch entry (`gather`).
    appends: gather::Gathered,
    /// Ledger and queue commands gathered since the last `drive`, for one
    /// command batch entry.
    commands: gather::Gathered,
    /// Outcomes of ticketed client appends not yet taken by the loop.
    client_done: Vec<crate::node::command::TicketDone>,
    /// Outcomes of ticketed commands not yet taken by the loop.
    command_done: Vec<crate::node::command::CommandDone>,
    /// Linearizable reads (queries and raw-log reads) waiting for their
    /// read-index round, by request id.
    reads_pending: BTreeMap<u64, LinearRead>,
    /// Reads whose round confirmed leadership, waiting for the applied
    /// index to reach the commit index the round saw.
    reads_confirmed: VecDeque<(Index, LinearRead)>,
    /// Ledger reads that found nothing past the LAC and wait (a long
    /// poll): answered as soon as an applied entry moves the LAC past
    /// what they ask, or with nothing at their deadline (node ms).
    tails: Vec<(u64, Query, QueryReply)>,
    /// Raw-log reads that found nothing committed and wait (a tail).
    log_tails: Vec<reads::LogTail>,
    next_read_id: u64,
    /// Answers waiting for cold reads (`cold`), and the WAL's count of
    /// finished cold reads when they were last filled.
    cold_waits: Vec<cold::Parked>,
    cold_reads_seen: u64,
    /// When (node ms) the WAL last made progress, and since when writes
    /// have been pending without any.
    pub(crate) last_fsync_ms: u64,
    pending_since_ms: Option<u64>,
    last_durable_ticket: Ticket,
    /// Set once the log stopped (EIO): the group is out of service here.
    pub(crate) stopped: Option<String>,
    /// A snapshot is wanted: the log grew by `snapshot_entries`.
    snapshot_due: bool,
    snapshot_job: Option<SnapshotJob>,
    /// A snapshot written, waiting for the log to be durable up to it.
    /// (With when its capture started, on the host's clock, µs.)
    snapshot_written: Option<(SnapshotWritten, u64)>,
    /// When (node ms) the next snapshot is due by time.
    next_snapshot_ms: u64,
    /// Take a snapshot at least this often while entries are applied.
    snapshot_interval_ms: u64,
    /// Also holds `retained_from`: the lowest log index the state at
    /// Raft's snapshot refers to (the log keeps every entry from there
    /// on; a follower that installs the snapshot gets them with it).
    pub(crate) snapshot_stats: SnapshotStats,
    /// Leader: image chunks being read for followers, one per follower.
    image_reads: Vec<ImageReadJob>,
    /// Leader: the chunk after the one last sent, read ahead while the
    /// follower stages that one (one per follower): taken when Raft asks
    /// for it, dropped when it asks for another position.
    image_read_ahead: Vec<ImageReadJob>,
    /// The log index each recent snapshot's state refers to from (the
    /// current one's and the one before).
    keep_from_by_snapshot: BTreeMap<Index, Option<Index>>,
    /// Follower: the image being staged from the leader, between chunks.
    staged: Option<crate::storage::wal::StagedImage<D>>,
    /// Follower: a chunk being staged (it holds the staged image).
    stage_job: Option<StageJob<D>>,
    /// The largest entry payload this group proposes: what the log stores
    /// and one transport message carries. Larger requests are refused
    /// before they are proposed (`ProposeError::TooLarge`).
    entry_bytes_max: usize,
    /// What this replica did, for a simulator's checkers (`None`: off).
    pub(crate) tap: Option<Vec<Note>>,
    /// A bug a simulator planted (`None` in the daemon).
    pub(crate) planted: Option<GlueBug>,
    /// A bug a simulator planted in the state-machine policy (`None` in
    /// the daemon).
    pub(crate) planted_workload: Option<WorkloadBug>,
    /// Entries below the snapshot to repair from peers (`repair`).
    repair: repair::Repair,
    /// The background scrub of the log (`scrub`).
    scrub: scrub::Scrub,
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Opens the replica of group `g` of node `spec` on its log, just
    /// opened, which recovered `restored`: Raft restarts from it (with an
    /// election jitter seeded by the host), the state from its snapshot
    /// (refused if it does not decode), and the first snapshot by time
    /// comes at a phase the host seeds.
    pub(crate) fn open(
        spec: &NodeSpec,
        g: &GroupSpec,
        wal: Wal<D>,
        restored: RestoredState,
        now_ms: u64,
        host: H,
    ) -> Result<Self, StartError> {
        let snapshot = restored.snapshot.clone();
        let raft = Raft::restore(spec.raft_config(g.group), host.seed(), now_ms, restored)
            .map_err(SpecError::Raft)?;
        let seed = host.seed();
        let message_bytes_max = spec.transport.message_bytes_max;
        let mut r = Replica::new(g.group, raft, wal, now_ms, message_bytes_max, host);
        r.set_snapshot_interval(spec.snapshot_interval_ms, now_ms, seed);
        r.set_scrub_rate(spec.wal.scrub_bytes_per_s);
        if let Some(s) = snapshot {
            if !r.restore_state(s.index, &s.data) {
                return Err(StartError::SnapshotUndecodable {
                    group: g.group,
                    dir: g.dir.clone(),
                    index: s.index,
                });
            }
            r.check_stored_entries(MissingFound::Open);
        }
        r.resume_staged();
        Ok(r)
    }

    /// A replica of `group` whose entries also fit a transport message
    /// of `message_bytes_max`.
    pub(crate) fn new(
        group: GroupId,
        raft: Raft,
        wal: Wal<D>,
        now_ms: u64,
        message_bytes_max: usize,
        host: H,
    ) -> Self {
        let reported = wal.durable();
        let entry_bytes_max = entry_bytes_max(&wal, message_bytes_max);
        Replica {
            entry_bytes_max,
            group,
            raft,
            wal,
            host,
            held: VecDeque::new(),
            reported,
            applied: 0,
            applied_hash: 0,
            dedup: DedupTable::default(),
            not_applied: BTreeSet::new(),
            machine: StateMachine::new(),
            waiters: BTreeMap::new(),
            led_term: None,
            transfer_target: None,
            step_down_answers: 0,
            transfer_asked: None,
            appends: gather::Gathered::default(),
            commands: gather::Gathered::default(),
            client_done: Vec::new(),
            command_done: Vec::new(),
            reads_pending: BTreeMap::new(),
            reads_confirmed: VecDeque::new(),
            tails: Vec::new(),
            log_tails: Vec::new(),
            next_read_id: 1,
            cold_waits: Vec::new(),
            cold_reads_seen: 0,
            last_fsync_ms: now_ms,
            pending_since_ms: None,
            last_durable_ticket: 0,
            stopped: None,
            snapshot_due: false,
            snapshot_job: None,
            snapshot_written: None,
            next_snapshot_ms: u64::MAX,
            snapshot_interval_ms: u64::MAX,
            snapshot_stats: SnapshotStats::default(),
            image_reads: Vec::new(),
            image_read_ahead: Vec::new(),
            keep_from_by_snapshot: BTreeMap::new(),
            staged: None,
            stage_job: None,

            tap: None,
            planted: None,
            planted_workload: None,
            repair: repair::Repair::default(),
            scrub: scrub::Scrub::default(),
        }
    }

    /// Records `note` if a tap is on.
    pub(super) fn note(&mut self, note: impl FnOnce() -> Note) {
        if let Some(tap) = &mut self.tap {
            tap.push(note());
        }
    }

    /// Runs the Ready loop until Raft has nothing to say; `out` collects
    /// the messages to send now.
    pub(crate) fn drive(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        // This turn's client appends, one entry for all of them.
        self.propose_gathered();
        if self.stopped.is_some() {
            return;
        }
        // Applying past the commit index would apply an entry a new leader
        // may still replace: this replica's state would diverge.
        assert!(self.applied <= self.raft.commit_index());
        // Raft learns what is applied from here alone (a snapshot from the
        // leader moves both): ahead of the state, it would let a snapshot
        // cover entries this state never applied.
        assert!(self.applied <= self.raft.applied_index());
        let (commit_in, applied_in) = (self.raft.commit_index(), self.applied);
        self.poll_image_reads();
        self.poll_stage();
        // Reporting durability to Raft (in `pump`) can commit entries: on
        // a leader whose own fsync completes after a follower's ack. They
        // are applied and answered in another round now, not at the loop's
        // next turn, which nothing else would wake (up to `TURN_MAX`).
        while self.drive_once(now_ms, out) {}
        if self.stopped.is_some() {
            return;
        }
        // After applying: what the old leader learnt committed is answered
        // with its outcome, only the rest is sent on.
        self.answer_lost_leadership();
        self.settle_transfer();
        self.drop_overtaken_stage();
        self.drive_repair(now_ms, out);
        self.drive_scrub(now_ms);
        if self.stopped.is_some() {
            return;
        }
        // A committed entry is durable on a majority and may have been
        // answered: a commit index that moved back could let another
        // leader's entry take its place.
        assert!(self.raft.commit_index() >= commit_in);
        // The state never goes back: what it applied was answered.
        assert!(self.applied >= applied_in);
        assert!(self.applied <= self.raft.commit_index());
        // Raft hands out for applying only what this log holds durably: a
        // state past it could be snapshotted with entries the log lacks.
        assert!(self.applied <= self.raft.persisted_index());
        // Every applied entry was reported, so Raft's compaction bound and
        // snapshot requests follow the state (see the entry check).
        assert_eq!(self.raft.applied_index(), self.applied);
    }

    /// One round of `drive`; true if it reported new durability to Raft.
    fn drive_once(&mut self, now_ms: u64, out: &mut Vec<Message>) -> bool {
        loop {
            let rd = self.raft.ready();
            if rd.is_empty() {
                break;
            }
            out.extend(rd.messages);
            let written = match self.write(
                rd.snapshot.as_ref(),
                rd.truncate_from,
                &rd.entries,
                rd.hard_state,
            ) {
                Ok(t) => t,
                Err(e) => {
                    self.stop(format!("{e}"));
                    return false;
                }
            };
            if !rd.messages_after_persist.is_empty() {
                let ticket = self.wal.current_ticket();
                // These (votes, acks) vouch for this Ready's writes: held
                // for a ticket that does not cover them, they would leave
                // before the data is durable, and a crash could lose an
                // entry a leader counted toward its commit.
                assert!(ticket >= written, "ticket {ticket} below {written}");
                // Tickets only grow, so the held queue is in ticket order
                // and `pump` releases it from the front.
                assert!(self.held.back().is_none_or(|(t, _)| *t <= ticket));
                let early = self.planted == Some(GlueBug::ReleaseBeforeDurable);
                if self.wal.durable_ticket() >= ticket || early {
                    out.extend(rd.messages_after_persist);
                } else {
                    self.held.push_back((ticket, rd.messages_after_persist));
                }
            }
            if let Some(s) = &rd.snapshot {
                if !self.restore_state(s.index, &s.data) {
                    let why = format!(
                        "the snapshot at {} from the leader does not decode",
                        s.index
                    );
                    self.stop(why);
                    return false;
                }
                self.note(|| Note::Restored { index: s.index });
                // The install brought the entries the leader's state
                // refers to: what is still missing is counted afresh.
                self.check_stored_entries(MissingFound::Install);
            }
            for e in rd.committed {
                self.apply(&e);
            }
            for rs in rd.read_states {
                if let Some(read) = self.reads_pending.remove(&rs.request_id) {
                    self.reads_confirmed.push_back((rs.index, read));
                }
            }
            self.serve_reads(now_ms);
            if self.applied > self.raft.applied_index() {
                self.raft.applied(self.applied);
            }
            self.snapshot_due |= rd.snapshot_wanted;
            for read in rd.image_reads {
                self.read_image_chunk(read);
            }
            if let Some(chunk) = rd.image_chunk {
                self.stage_image_chunk(chunk);
            }
        }
        if !self.tails.is_empty() {
            self.serve_reads(now_ms); // a deadline may have passed
        }
        if !self.log_tails.is_empty() {
            self.serve_log_tails(now_ms);
        }
        self.snapshot(now_ms);
        let reported = self.reported;
        self.pump(now_ms, out);
        self.stopped.is_none() && self.reported != reported
    }

    fn write(
        &mut self,
        snapshot: Option<&crate::consensus::Snapshot>,
        truncate_from: Option<Index>,
        entries: &[Entry],
        hard_state: Option<crate::consensus::HardState>,
    ) -> Result<Ticket, WalError> {
        // The highest ticket of the writes queued here (0: none; a
        // snapshot is durable once `install_snapshot` returns).
        let mut ticket = 0;
        if let Some(s) = snapshot {
            // A snapshot of our own being written goes to the slot the
            // install writes: wait for it, and drop it (this one is newer).
            if let Some(job) = self.snapshot_job.take() {
                let _ = job.done.wait();
            }
            self.snapshot_written = None;
            // The staged image's entries become the log (the leader's
            // state refers to them).
            let staged = self.staged.take();
            let usable = staged.as_ref().map(|st| self.wal.check_staged(s, st));
            match (staged, usable) {
                (Some(staged), Some(Ok(()))) => self.wal.adopt_staged(s, staged)?,
                (staged, why) => {
                    // Raft installs only what was staged whole: a bug, or
                    // a log that grew into the staged numbers. The entries
                    // the state refers to are then missing, and repaired
                    // from peers like any (`check_stored_entries`).
                    if self.raft.snapshot_with_entries() {
                        let why = why.and_then(Result::err).unwrap_or("none staged".into());
                        log_warn!(
                            "group {}: the snapshot at {} installed without its staged image ({why})",
                            self.group,
                            s.index
                        );
                    }
                    if staged.is_some() {
                        drop(staged);
                        self.discard_staged();
                    }
                    self.wal.install_snapshot(s, &[])?
                }
            }
            self.note(|| Note::Installed {
                snapshot: s.clone(),
            });
            self.reported = (s.index, s.term);
            self.raft.persisted(s.index, s.term);
        }
        if truncate_from.is_some() || !entries.is_empty() {
            ticket = self.wal.append(truncate_from, entries)?;
        }
        if let Some(hs) = hard_state {
            ticket = ticket.max(self.wal.set_hard_state(hs)?);
        }
        if truncate_from.is_some() || !entries.is_empty() || hard_state.is_some() {
            self.note(|| Note::Wrote {
                ticket,
                truncate_from,
                entries: entries.to_vec(),
                hard_state,
            });
        }
        Ok(ticket)
    }

    /// Submits queued writes, reaps completions, reports durability and
    /// releases held messages into `out`.
    pub(crate) fn pump(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        if self.stopped.is_some() {
            return;
        }
        if let Err(e) = self.wal.poll() {
            if !matches!(e, WalError::DiskFull) {
                self.stop(format!("{e}"));
                return;
            }
        }
        self.retry_cold_waits();
        let durable_ticket = self.wal.durable_ticket();
        // Durability only grows, and only over what was queued: messages
        // released for a ticket vouch for its writes, so a ticket that
        // went back (or ran ahead) would have released acks for data a
        // crash can lose.
        assert!(durable_ticket >= self.last_durable_ticket);
        assert!(durable_ticket <= self.wal.current_ticket());
        if durable_ticket != self.last_durable_ticket {
            self.last_durable_ticket = durable_ticket;
            self.last_fsync_ms = now_ms;
        }
        let pending = durable_ticket < self.wal.current_ticket();
        self.pending_since_ms = match (pending, self.pending_since_ms) {
            (false, _) => None,
            (true, None) => Some(now_ms),
            (true, Some(t)) => Some(t),
        };
        let durable = self.wal.durable();
        if durable != self.reported {
            self.reported = durable;
            self.raft.persisted(durable.0, durable.1);
        }
        while self.held.front().is_some_and(|(t, _)| *t <= durable_ticket) {
            out.extend(self.held.pop_front().expect("front exists").1);
        }
    }

    /// True while writes are pending.
    pub(crate) fn writes_pending(&self) -> bool {
        self.pending_since_ms.is_some()
    }

    /// True if writes have been pending for `stall_ms` with no fsync.
    pub(crate) fn disk_stalled(&self, now_ms: u64, stall_ms: u64) -> bool {
        self.pending_since_ms
            .is_some_and(|t| now_ms >= t.max(self.last_fsync_ms) + stall_ms)
    }

    /// The log failed: this group stops on this node, waiting clients
    /// learn it, and it never leads again until restarted.
    fn stop(&mut self, why: String) {
        log_error!("group {}: log stopped: {why}", self.group);
        if self.raft.role() == Role::Leader {
            self.raft.step_down();
        }
        for (_, w) in std::mem::take(&mut self.waiters) {
            w.reply
                .fail(ProposeError::LogStopped(why.clone()), &mut self.client_done);
        }
        if let Some((_, _, reply)) = self.transfer_asked.take() {
            reply(Err(ProposeError::LogStopped(why.clone())));
        }
        for (_, read) in std::mem::take(&mut self.reads_pending) {
            read.fail(ProposeError::LogStopped(why.clone()));
        }
        for (_, read) in std::mem::take(&mut self.reads_confirmed) {
            read.fail(ProposeError::LogStopped(why.clone()));
        }
        for (_, _, reply) in std::mem::take(&mut self.tails) {
            reply(Err(ProposeError::LogStopped(why.clone())));
        }
        for tail in std::mem::take(&mut self.log_tails) {
            tail.fail(ProposeError::LogStopped(why.clone()));
        }
        self.fail_cold_waits(&ProposeError::LogStopped(why.clone()));
        self.held.clear();
        self.note(|| Note::Stopped);
        self.stopped = Some(why);
    }

    /// This group as this node (`me`) sees it, for the status.
    pub(crate) fn view(&self, me: NodeId) -> GroupView {
        GroupView {
            group: self.group,
            role: self.raft.role(),
            term: self.raft.term(),
            leader: self.raft.leader(),
            preferred_leader: self.raft.preferred_leader(),
            commit: self.raft.commit_index(),
            applied: self.applied,
            persisted: self.raft.persisted_index(),
            applied_hash: self.applied_hash,
            voters: self.raft.membership().voters.iter().copied().collect(),
            learners: self.raft.membership().learners.iter().copied().collect(),
            disk: self.disk_state(),
            backend: self.wal.backend_name(),
            snapshot: {
                let mut s = self.snapshot_stats;
                s.installed = self.raft.stats().snapshots_installed;
                if let Some((snap, total, held)) = self.raft.image_receiving() {
                    (s.image_index, s.image_held, s.image_total) = (snap.index, held, total);
                }
                s
            },
            repair: self.repair_stats(),
            scrub: self.scrub_stats(),
            waiting_reads: self.waiting_reads(),
            step_down_answers: self.step_down_answers,
            wal: {
                let m = self.wal.metrics();
                WalView {
                    flushes: m.flushes,
                    flush_p50_us: m.flush_latency_us.value_at_quantile(0.5),
                    flush_p99_us: m.flush_latency_us.value_at_quantile(0.99),
                    records_per_flush_p50: m.records_per_flush.value_at_quantile(0.5),
                    bytes: m.bytes,
                    segments_recycled: m.segments_recycled,
                    segments_zero_filled: m.segments_zero_filled,
                    stalls: m.stalls,
                    io_errors: m.io_errors,
                    disk_full_refusals: m.disk_full_refusals,
                    cold_reads: m.cold_reads,
                    cold_read_errors: m.cold_read_errors,
                    entries_repaired: m.entries_repaired,
                }
            },
            follower_lag: if self.raft.role() == Role::Leader {
                self.raft
                    .membership()
                    .members()
                    .filter(|&p| p != me)
                    .filter_map(|p| {
                        let m = self.raft.progress(p)?.match_index;
                        Some((p, self.raft.last_index().saturating_sub(m)))
                    })
                    .collect()
            } else {
                Vec::new()
            },
            stats: self.raft.stats(),
        }
    }

    /// This group's line in the node's heartbeat.
    pub(crate) fn group_status(&self) -> GroupStatus {
        GroupStatus {
            group: self.group,
            role: self.raft.role(),
            term: self.raft.term(),
            leader: self.raft.leader().unwrap_or(0),
            commit: self.raft.commit_index(),
            persisted: self.raft.persisted_index(),
            last_fsync_ms: self.last_fsync_ms,
            writes_pending: self.writes_pending(),
        }
    }

    /// The disk state to report.
    pub(crate) fn disk_state(&self) -> String {
        match (&self.stopped, self.wal.state()) {
            (Some(why), _) => format!("failed: {why}"),
            (None, DiskState::Healthy) => "healthy".into(),
            (None, DiskState::Degraded) => "degraded".into(),
            (None, DiskState::Full) => "full".into(),
            (None, DiskState::Failed(why)) => format!("failed: {why}"),
        }
    }
}

/// The answer for a proposal or read-index round the Raft core refused.
fn refused_by_raft(e: crate::consensus::RaftError) -> ProposeError {
    use crate::consensus::RaftError as E;
    match e {
        E::NotLeader { leader } => ProposeError::NotLeader(leader),
        E::InvalidMembershipChange(why) => ProposeError::Invalid(why.to_string()),
        E::MembershipChangePending | E::TransferInProgress => ProposeError::Busy(e.to_string()),
        // Only compaction and snapshots name an index; a proposal never.
        E::InvalidIndex(_) => ProposeError::Internal(e.to_string()),
    }
}
