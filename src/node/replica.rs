//! One group's replica on this node: its Raft core and its log, joined by
//! the `Ready` contract (consensus/mod.rs): write what Ready asks, send its
//! `messages` at once and its `messages_after_persist` only once the WAL
//! reports everything queued before them durable, report durability back
//! with `persisted`, apply what is committed.

use super::command::{ProposeError, QueryReply, ReadReply, Reply, StateReply};
use super::log::{log_error, log_warn};
use super::status::SnapshotStats;
use crate::consensus::{Entry, Index, Message, Payload, Raft, Role, Term};
use crate::state::dedup::{
    decode_client_entry, encode_client_entry, fingerprint, Applied, DedupTable,
};
use crate::state::query::{decode_command_entry, encode_command_entry};
use crate::state::{Answer, Command, Error as StateError, Outcome, Query, StateMachine};
use crate::storage::{DiskState, Ticket, Wal, WalError};
use crate::transport::GroupId;
use crossbeam_channel::{bounded, Receiver, TryRecvError};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

/// A read waiting for its read-index round (thesis §6.4), then for the
/// applied index to reach the commit index the round saw: a state-machine
/// query, or a read (or tail) of the raw log.
enum LinearRead {
    Query {
        query: Query,
        wait_ms: u32,
        reply: QueryReply,
    },
    Log {
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        reply: ReadReply,
    },
}

impl LinearRead {
    fn fail(self, why: ProposeError) {
        match self {
            LinearRead::Query { reply, .. } => reply(Err(why)),
            LinearRead::Log { reply, .. } => reply(Err(why)),
        }
    }
}

/// A learner is caught up, and may be promoted to voter without `force`,
/// when its match index (on the leader) is at most this many entries
/// below the leader's last index. Small: a few batches in flight at the
/// moment of promotion, which a voter that starts counting in quorums
/// fetches within one round trip, so no commit waits on it for long.
pub const LEARNER_CAUGHT_UP_ENTRIES_MAX: u64 = 64;

/// The largest entry payload a group proposes: one its log stores (the
/// WAL's limit counts the entry's header too) and one AppendEntries
/// message of at most `message_bytes_max` carries (with the envelope byte).
fn entry_bytes_max(wal: &Wal, message_bytes_max: usize) -> usize {
    let stored = wal
        .entry_bytes_max()
        .saturating_sub(crate::consensus::ENTRY_OVERHEAD_BYTES);
    let carried = message_bytes_max
        .saturating_sub(1 + crate::transport::raft_codec::APPEND_OVERHEAD_BYTES_MAX);
    stored.min(carried)
}

/// The fingerprint of a command for the dedup table: of its bytes as the
/// client sent them, so the clock the leader stamps on some commands
/// (which a retry through another leader stamps anew) does not count.
fn command_fingerprint(command: &Command, bytes: &[u8]) -> u64 {
    let mut unstamped = match command {
        Command::CreateLedger { .. } | Command::Consume { .. } => command.clone(),
        _ => return fingerprint(bytes),
    };
    if let Command::CreateLedger { now_ms, .. } | Command::Consume { now_ms, .. } = &mut unstamped {
        *now_ms = 0;
    }
    fingerprint(&unstamped.encode())
}

/// A client waiting for its entry to be applied.
pub(crate) struct Waiter {
    term: Term,
    reply: WaiterReply,
}

/// What a waiter wants to hear: the index its entry was applied at, or
/// the state machine's outcome.
enum WaiterReply {
    Index(Reply),
    State(StateReply),
}

impl WaiterReply {
    fn fail(self, why: ProposeError) {
        match self {
            WaiterReply::Index(r) => r(Err(why)),
            WaiterReply::State(r) => r(Err(why)),
        }
    }
}

/// What applying an entry answers its waiter: the index (an append, a
/// membership change) or the state machine's outcome (a command); the
/// kind matches the waiter's `WaiterReply`.
enum WaiterAnswer {
    Index(Result<Index, ProposeError>),
    State(Result<Outcome, ProposeError>),
}

/// A snapshot written by the helper thread: the snapshot, its bytes, and
/// the lowest log index its state refers to.
type SnapshotWritten = (crate::consensus::Snapshot, usize, Option<Index>);

/// A snapshot image being read from the segments and encoded on a
/// helper thread, for a follower behind the trimmed log.
struct ImageJob {
    index: Index,
    done: Receiver<Result<Vec<u8>, WalError>>,
}

/// A snapshot being encoded and written on a helper thread.
struct SnapshotJob {
    index: Index,
    started: Instant,
    done: Receiver<Result<SnapshotWritten, WalError>>,
}

/// One group on this node.
pub(crate) struct Replica {
    pub(crate) group: GroupId,
    pub(crate) raft: Raft,
    pub(crate) wal: Wal,
    /// Messages that leave once the ticket is durable.
    held: VecDeque<(Ticket, Vec<Message>)>,
    /// What was last reported to Raft as persisted.
    reported: (Index, Term),
    /// Applied state: the index and a running hash of applied data.
    pub(crate) applied: Index,
    pub(crate) applied_hash: u64,
    /// Client appends applied, for idempotent retries.
    dedup: DedupTable,
    /// Indexes of client appends the dedup table did not apply (a retry
    /// of an applied append is proposed again, so the log holds it twice):
    /// reads skip them as they skip no-ops, so a record is read once.
    /// Rebuilt by replay after a restart (apply is deterministic) and
    /// pruned below the snapshot (those indexes are no longer readable).
    not_applied: BTreeSet<Index>,
    /// The ledgers and queues, applied from committed command entries.
    pub(crate) machine: StateMachine,
    waiters: BTreeMap<Index, Waiter>,
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
    /// Raw-log reads that found nothing committed and wait (a tail):
    /// (deadline in node ms, from, max entries, max bytes, reply).
    log_tails: Vec<(u64, Index, usize, usize, ReadReply)>,
    next_read_id: u64,
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
    snapshot_written: Option<(SnapshotWritten, Instant)>,
    /// When (node ms) the next snapshot is due by time.
    next_snapshot_ms: u64,
    /// Take a snapshot at least this often while entries are applied.
    snapshot_interval_ms: u64,
    /// Also holds `retained_from`: the lowest log index the state at
    /// Raft's snapshot refers to (the log keeps every entry from there
    /// on; a follower that installs the snapshot gets them with it).
    pub(crate) snapshot_stats: SnapshotStats,
    image_job: Option<ImageJob>,
    /// The largest entry payload this group proposes: what the log stores
    /// and one transport message carries. Larger requests are refused
    /// before they are proposed (`ProposeError::TooLarge`).
    entry_bytes_max: usize,
}

impl Replica {
    /// A replica of `group` whose entries also fit a transport message
    /// of `message_bytes_max`.
    pub(crate) fn new(
        group: GroupId,
        raft: Raft,
        wal: Wal,
        now_ms: u64,
        message_bytes_max: usize,
    ) -> Self {
        let reported = wal.durable();
        let entry_bytes_max = entry_bytes_max(&wal, message_bytes_max);
        Replica {
            entry_bytes_max,
            group,
            raft,
            wal,
            held: VecDeque::new(),
            reported,
            applied: 0,
            applied_hash: 0,
            dedup: DedupTable::default(),
            not_applied: BTreeSet::new(),
            machine: StateMachine::new(),
            waiters: BTreeMap::new(),
            reads_pending: BTreeMap::new(),
            reads_confirmed: VecDeque::new(),
            tails: Vec::new(),
            log_tails: Vec::new(),
            next_read_id: 1,
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
            image_job: None,
        }
    }

    /// Takes a snapshot at least every `interval_ms`, the first one at a
    /// random point (from `seed`) between half and one and a half
    /// intervals from `now_ms`: replicas started together do not all
    /// snapshot at once, and a commit needs only a majority of them.
    pub(crate) fn set_snapshot_interval(&mut self, interval_ms: u64, now_ms: u64, seed: u64) {
        self.snapshot_interval_ms = interval_ms;
        let phase = seed % interval_ms.max(1);
        self.next_snapshot_ms = now_ms.saturating_add(interval_ms / 2).saturating_add(phase);
    }

    /// Proposes a client append with its client id and sequence number:
    /// applied once however often it is retried; the reply is the index
    /// it was applied at (the original one for a retry).
    pub(crate) fn propose_client(&mut self, client_id: u64, seq: u64, data: &[u8], reply: Reply) {
        self.propose(encode_client_entry(client_id, seq, data), reply);
    }

    /// Restores the state machine from a snapshot's data: the applied
    /// hash (u64), the dedup table, then the ledgers and queues (as the
    /// snapshot thread in `snapshot` writes them). False if the data does
    /// not decode.
    pub(crate) fn restore_state(&mut self, index: Index, data: &[u8]) -> bool {
        let Some(hash) = data.get(..8) else {
            return false;
        };
        let Some((table, used)) = DedupTable::decode(&data[8..]) else {
            return false;
        };
        let Ok(machine) = StateMachine::restore(&data[8 + used..]) else {
            return false;
        };
        if machine.applied_index() > index {
            return false;
        }
        self.applied = index;
        self.applied_hash = u64::from_le_bytes(hash.try_into().expect("8 bytes"));
        self.dedup = table;
        self.not_applied = self.not_applied.split_off(&(index + 1));
        self.set_keep_from(machine.oldest_stored());
        self.machine = machine;
        true
    }

    /// Proposes a membership change; the reply comes once it is applied.
    /// A promotion (`AddVoter`) without `force` is refused unless the node
    /// is a learner that has caught up (`promotion_refused`).
    pub(crate) fn propose_membership(
        &mut self,
        change: crate::consensus::MembershipChange,
        force: bool,
        reply: Reply,
    ) {
        if let Some(why) = &self.stopped {
            reply(Err(ProposeError::LogStopped(why.clone())));
            return;
        }
        if let crate::consensus::MembershipChange::AddVoter(id) = change {
            if let Some(e) = self.promotion_refused(id, force) {
                reply(Err(e));
                return;
            }
        }
        match self.raft.propose_membership(change) {
            Ok((index, term)) => {
                let reply = WaiterReply::Index(reply);
                self.waiters.insert(index, Waiter { term, reply });
            }
            Err(e) => reply(Err(refused_by_raft(e))),
        }
    }

    /// Why promoting `id` to voter is refused, if it is (thesis §4.2.1: a
    /// server that votes before it has the log makes the group wait for
    /// it, or lose availability, while it catches up). Only the leader
    /// knows a learner's match index, so only the leader checks; on a
    /// follower the proposal answers `NotLeader`. A node that is already a voter is refused even with
    /// `force` (the change would not apply); one that is not a member at
    /// all is refused unless `force` (then it joins as a voter at once);
    /// a learner more than `LEARNER_CAUGHT_UP_ENTRIES_MAX` entries behind
    /// the leader's last index is refused unless `force`.
    fn promotion_refused(&self, id: crate::consensus::NodeId, force: bool) -> Option<ProposeError> {
        if self.raft.role() != Role::Leader {
            return None;
        }
        let m = self.raft.membership();
        if m.voters.contains(&id) {
            return Some(ProposeError::Invalid(format!(
                "node {id} is already a voter: nothing to promote"
            )));
        }
        if force {
            return None;
        }
        if !m.learners.contains(&id) {
            return Some(ProposeError::Invalid(format!(
                "node {id} is not a learner (not a member of the group): add it as a learner first, wait for it to catch up, then promote it (or --force)"
            )));
        }
        let last = self.raft.last_index();
        let matched = self.raft.progress(id).map_or(0, |p| p.match_index);
        let behind = last.saturating_sub(matched);
        (behind > LEARNER_CAUGHT_UP_ENTRIES_MAX).then(|| {
            ProposeError::Lagging(format!(
                "node {id} is a learner {behind} entries behind the leader (at most {LEARNER_CAUGHT_UP_ENTRIES_MAX}): wait, or --force"
            ))
        })
    }

    /// Proposes client data; the reply comes once it is applied.
    pub(crate) fn propose(&mut self, data: Vec<u8>, reply: Reply) {
        self.propose_entry(data, WaiterReply::Index(reply));
    }

    /// Proposes a ledger or queue command as client `client_id`'s request
    /// `seq` (0: not deduplicated); the reply is its outcome once applied.
    /// The leader's wall clock (`now_ms`) is stamped on the commands that
    /// carry one: every replica then applies the same time.
    pub(crate) fn propose_command(
        &mut self,
        client_id: u64,
        seq: u64,
        mut command: Command,
        now_ms: u64,
        reply: StateReply,
    ) {
        match &mut command {
            Command::CreateLedger { now_ms: t, .. } | Command::Consume { now_ms: t, .. } => {
                *t = now_ms
            }
            _ => {}
        }
        let entry = encode_command_entry(client_id, seq, &command.encode());
        self.propose_entry(entry, WaiterReply::State(reply));
    }

    fn propose_entry(&mut self, data: Vec<u8>, reply: WaiterReply) {
        if let Some(why) = &self.stopped {
            reply.fail(ProposeError::LogStopped(why.clone()));
            return;
        }
        if data.len() > self.entry_bytes_max {
            reply.fail(ProposeError::TooLarge {
                bytes: data.len(),
                max: self.entry_bytes_max,
            });
            return;
        }
        if let Err(WalError::DiskFull) = self.wal.admit() {
            reply.fail(ProposeError::DiskFull);
            return;
        }
        match self.raft.propose(data) {
            Ok((index, term)) => {
                self.waiters.insert(index, Waiter { term, reply });
            }
            Err(e) => reply.fail(refused_by_raft(e)),
        }
    }

    /// Answers `query` linearizably: a read-index round confirms this node
    /// still leads, then the query waits until the state has applied
    /// everything committed when it arrived (Raft thesis §6.4). A ledger
    /// read with `wait_ms` that finds nothing past the LAC then waits up
    /// to `wait_ms` for an entry to be confirmed (a long poll): the
    /// entries it gets are committed, so answering from the applied state
    /// as it moves on stays linearizable.
    pub(crate) fn query(&mut self, query: Query, wait_ms: u32, reply: QueryReply) {
        self.read_linear(LinearRead::Query {
            query,
            wait_ms,
            reply,
        });
    }

    /// Reads the raw log linearizably (the default for `Read` and `Tail`):
    /// the same read-index round as `query`, then `read_or_wait` once the
    /// applied index reaches the commit index the round saw, so the answer
    /// holds every entry committed before the read arrived. A follower
    /// answers `NotLeader`; `read_or_wait` alone is the stale read.
    /// A tail that then waits is answered with entries as they are applied:
    /// they are committed, so that stays linearizable.
    pub(crate) fn read_log(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        reply: ReadReply,
    ) {
        self.read_linear(LinearRead::Log {
            from,
            max_entries,
            max_bytes,
            wait_ms,
            reply,
        });
    }

    /// Starts the read-index round of `read`, or refuses it here.
    fn read_linear(&mut self, read: LinearRead) {
        if let Some(why) = &self.stopped {
            read.fail(ProposeError::LogStopped(why.clone()));
            return;
        }
        let id = self.next_read_id;
        self.next_read_id += 1;
        match self.raft.read_index(id) {
            Ok(()) => {
                self.reads_pending.insert(id, read);
            }
            Err(e) => read.fail(refused_by_raft(e)),
        }
    }

    /// Serves the confirmed queries the applied state has caught up with,
    /// and the waiting ledger reads it now has entries for (or whose wait
    /// ended); fails the unconfirmed and the waiting ones once this node
    /// no longer leads.
    fn serve_reads(&mut self, now_ms: u64) {
        while self
            .reads_confirmed
            .front()
            .is_some_and(|(at, _)| *at <= self.applied)
        {
            let (_, read) = self.reads_confirmed.pop_front().expect("front exists");
            let (q, wait_ms, reply) = match read {
                LinearRead::Query {
                    query,
                    wait_ms,
                    reply,
                } => (query, wait_ms, reply),
                LinearRead::Log {
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    reply,
                } => {
                    self.read_or_wait(from, max_entries, max_bytes, wait_ms, now_ms, reply);
                    continue;
                }
            };
            let answer = self.machine.query(&q).map_err(ProposeError::Refused);
            if wait_ms > 0 && matches!(&answer, Ok(Answer::Entries(es)) if es.is_empty()) {
                let deadline = now_ms.saturating_add(u64::from(wait_ms));
                self.tails.push((deadline, q, reply));
                continue;
            }
            reply(self.filled(answer));
        }
        let mut i = 0;
        while i < self.tails.len() {
            let (deadline, q, _) = &self.tails[i];
            let answer = self.machine.query(q).map_err(ProposeError::Refused);
            let empty = matches!(&answer, Ok(Answer::Entries(es)) if es.is_empty());
            if empty && now_ms < *deadline {
                i += 1;
                continue;
            }
            let (_, _, reply) = self.tails.swap_remove(i);
            reply(self.filled(answer));
        }
        if self.raft.role() != Role::Leader
            && !(self.reads_pending.is_empty() && self.tails.is_empty())
        {
            let leader = self.raft.leader();
            for (_, read) in std::mem::take(&mut self.reads_pending) {
                read.fail(ProposeError::NotLeader(leader));
            }
            for (_, _, reply) in std::mem::take(&mut self.tails) {
                reply(Err(ProposeError::NotLeader(leader)));
            }
        }
    }

    /// An answer with the bytes of its entries or messages read from the
    /// log.
    fn filled(&mut self, answer: Result<Answer, ProposeError>) -> Result<Answer, ProposeError> {
        answer.and_then(
            |mut a| match a.fill(&mut payload_at(&self.raft, &mut self.wal)) {
                Ok(()) => Ok(a),
                Err(i) => {
                    self.snapshot_stats.unreadable_entries += 1;
                    Err(stored_missing(self.group, i))
                }
            },
        )
    }

    /// Reads waiting for an entry: ledger reads and raw-log tails.
    pub(crate) fn waiting_reads(&self) -> usize {
        self.tails.len() + self.log_tails.len()
    }

    /// The earliest deadline of a waiting read (node ms), so the loop
    /// wakes for it.
    pub(crate) fn next_tail_deadline(&self) -> Option<u64> {
        let ledger = self.tails.iter().map(|(d, _, _)| *d);
        ledger.chain(self.log_tails.iter().map(|t| t.0)).min()
    }

    /// `read`, except that finding nothing from `from` on, it waits up
    /// to `wait_ms` (node ms from `now_ms`) for an entry to be applied
    /// here, and is answered then (or empty at the end): a tail of the raw
    /// log, with no thread waiting and nothing polled.
    pub(crate) fn read_or_wait(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        now_ms: u64,
        reply: ReadReply,
    ) {
        match self.read(from, max_entries, max_bytes) {
            Ok(v) if v.is_empty() && wait_ms > 0 => {
                let deadline = now_ms.saturating_add(u64::from(wait_ms));
                self.log_tails
                    .push((deadline, from, max_entries, max_bytes, reply));
            }
            r => reply(r),
        }
    }

    /// Answers the waiting raw-log tails that have entries now, or whose
    /// wait ended.
    fn serve_log_tails(&mut self, now_ms: u64) {
        let mut i = 0;
        while i < self.log_tails.len() {
            let (deadline, from, max_entries, max_bytes, _) = self.log_tails[i];
            let r = self.read(from, max_entries, max_bytes);
            if matches!(&r, Ok(v) if v.is_empty()) && now_ms < deadline {
                i += 1;
                continue;
            }
            let (_, _, _, _, reply) = self.log_tails.swap_remove(i);
            reply(r);
        }
    }

    /// Runs the Ready loop until Raft has nothing to say; `out` collects
    /// the messages to send now.
    pub(crate) fn drive(&mut self, now_ms: u64, out: &mut Vec<Message>) {
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
        self.poll_image();
        // Reporting durability to Raft (in `pump`) can commit entries: on
        // a leader whose own fsync completes after a follower's ack. They
        // are applied and answered in another round now, not at the loop's
        // next turn, which nothing else would wake (up to `TURN_MAX`).
        while self.drive_once(now_ms, out) {}
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
            let snapshot = rd.snapshot.as_ref().map(|s| (s, &rd.snapshot_entries[..]));
            let written = match self.write(snapshot, rd.truncate_from, &rd.entries, rd.hard_state) {
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
                if self.wal.durable_ticket() >= ticket {
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
            if let Some(index) = rd.snapshot_entries_wanted {
                self.build_snapshot_image(index);
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

    /// Starts a snapshot when one is due (log growth or the interval) and
    /// adopts one that finished. The loop only captures the state: the
    /// ledgers and queues are persistent maps, so their copy is O(1) and
    /// shares everything with the live state (copy-on-write); the dedup
    /// table is not, and its copy is deep, in time and memory
    /// proportional to its size (`capture_us` measures both copies).
    /// Encoding and the fsynced file write run on a helper thread, so
    /// appends do not wait for them.
    fn snapshot(&mut self, now_ms: u64) {
        if let Some(job) = &self.snapshot_job {
            match job.done.try_recv() {
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.snapshot_job = None;
                    self.snapshot_stats.failed += 1;
                }
                Ok(Err(e)) => {
                    log_warn!(
                        "group {}: snapshot at {} not written: {e}",
                        self.group,
                        job.index
                    );
                    self.snapshot_job = None;
                    self.snapshot_stats.failed += 1;
                }
                Ok(Ok(written)) => {
                    let job = self.snapshot_job.take().expect("checked above");
                    self.snapshot_written = Some((written, job.started));
                }
            }
        }
        // Adopted once the log is durable up to the snapshot: its state may
        // refer to those entries, and Raft forgets them from memory then.
        let durable = self.wal.durable().0;
        if let Some(((snap, _, _), _)) = &self.snapshot_written {
            if durable >= snap.index {
                let ((snap, bytes, keep_from), started) =
                    self.snapshot_written.take().expect("checked above");
                let (index, term) = (snap.index, snap.term);
                // Refused if the leader installed a newer one meanwhile.
                if let Ok(replaced) = self.raft.compact_prepared(snap) {
                    self.not_applied = self.not_applied.split_off(&(index + 1));
                    if let Some(old) = replaced.filter(|o| o.data.len() > 1 << 20) {
                        // Freed off the loop: returning tens of MB to
                        // the OS (munmap) takes milliseconds.
                        let _ = std::thread::Builder::new()
                            .name("quire-free".into())
                            .spawn(move || drop(old));
                    }
                    self.set_keep_from(keep_from);
                    if let Err(e) = self.wal.adopt_snapshot(index, term, keep_from) {
                        self.stop(format!("{e}"));
                        return;
                    }
                    let s = &mut self.snapshot_stats;
                    s.taken += 1;
                    s.last_index = index;
                    s.last_bytes = bytes as u64;
                    s.last_us = started.elapsed().as_micros() as u64;
                }
                // Else the leader installed a newer one meanwhile: the
                // slot this one was written to is simply written over.
            }
        }
        if self.snapshot_written.is_some() {
            return;
        }
        let snapshot_index = self.raft.snapshot().map_or(0, |s| s.index);
        let interval = now_ms >= self.next_snapshot_ms;
        if !(self.snapshot_due || interval) || self.applied <= snapshot_index {
            return;
        }
        let Ok((term, membership)) = self.raft.snapshot_meta(self.applied) else {
            return;
        };
        let started = Instant::now();
        let (index, hash) = (self.applied, self.applied_hash);
        let (dedup, machine) = (self.dedup.clone(), self.machine.clone());
        let capture_us = started.elapsed().as_micros() as u64;
        let slot = self.wal.free_snapshot_slot();
        let (tx, done) = bounded(1);
        let spawned = std::thread::Builder::new()
            .name(format!("quire-snap-g{}", self.group))
            .spawn(move || {
                lower_priority();
                let mut data = hash.to_le_bytes().to_vec();
                dedup.encode(&mut data);
                data.extend_from_slice(&machine.snapshot());
                let bytes = data.len();
                let keep_from = machine.oldest_stored();
                let snap = crate::consensus::Snapshot {
                    index,
                    term,
                    membership,
                    data,
                };
                let r = crate::storage::write_snapshot_file(&slot, &snap)
                    .map(|()| (snap, bytes, keep_from));
                let _ = tx.send(r);
            });
        if spawned.is_err() {
            self.snapshot_stats.failed += 1;
            return;
        }
        self.snapshot_due = false;
        self.next_snapshot_ms = now_ms.saturating_add(self.snapshot_interval_ms);
        self.snapshot_stats.last_capture_us = capture_us;
        self.snapshot_job = Some(SnapshotJob {
            index,
            started,
            done,
        });
    }

    /// At start: counts the log entries below Raft's log that the state
    /// refers to and the log cannot read (a damaged segment below the
    /// snapshot). This replica cannot serve their bytes while it leads;
    /// nothing repairs them from a peer yet, so it says so, loudly.
    pub(crate) fn check_stored_entries(&mut self) {
        let in_memory_from = self.raft.first_index();
        let mut missing = BTreeSet::new();
        let wal = &self.wal;
        self.machine.each_stored(&mut |i| {
            if i < in_memory_from && !wal.holds(i) {
                missing.insert(i);
            }
        });
        self.snapshot_stats.unreadable_entries = missing.len() as u64;
        if let Some(first) = missing.first() {
            log_warn!(
                "group {}: {} log entries the ledgers and queues refer to are unreadable here (the first: {first}); \
                 this replica cannot serve their bytes while it leads: replace its log (HARDWARE.md, \"Replacing a disk\")",
                self.group,
                missing.len()
            );
        }
    }

    fn set_keep_from(&mut self, keep_from: Option<Index>) {
        // Index 0 holds no entry, so 0 can stand for "none".
        self.snapshot_stats.retained_from = keep_from.unwrap_or(0);
    }

    /// The lowest log index the state at Raft's snapshot refers to.
    fn keep_from(&self) -> Option<Index> {
        Some(self.snapshot_stats.retained_from).filter(|&i| i > 0)
    }

    /// Answers Raft's request for the image of the snapshot at `index`
    /// (a follower is behind the trimmed log): the entries from
    /// `keep_from()` to `index` are read from the segments and
    /// encoded with the snapshot on a helper thread, so a large backlog
    /// does not stall the loop; `poll_image` hands the image to Raft.
    fn build_snapshot_image(&mut self, index: Index) {
        if self.image_job.as_ref().is_some_and(|j| j.index == index) {
            return;
        }
        let Some(meta) = self.raft.snapshot().filter(|s| s.index == index) else {
            return; // a newer snapshot since; asked again for that one
        };
        let meta = meta.data.clone();
        let located = match self.keep_from() {
            None => Ok(None),
            Some(from) => self.wal.locate(from, index).map(|l| Some((from, l))),
        };
        let located = match located {
            Ok(l) => l,
            Err(e) => {
                log_warn!(
                    "group {}: locating the entries for a snapshot at {index}: {e}",
                    self.group
                );
                return;
            }
        };
        let (tx, done) = bounded(1);
        let spawned = std::thread::Builder::new()
            .name(format!("quire-image-g{}", self.group))
            .spawn(move || {
                lower_priority();
                let entries = match &located {
                    None => Ok(Vec::new()),
                    Some((from, l)) => {
                        crate::storage::read_located(l, *from, index).and_then(|es| {
                            if es.len() as u64 == index + 1 - from {
                                Ok(es)
                            } else {
                                Err(WalError::Invalid(format!(
                                    "{} of the entries {from}..={index} read",
                                    es.len()
                                )))
                            }
                        })
                    }
                };
                let _ = tx.send(entries.map(|es| crate::consensus::encode_image(&meta, &es)));
            });
        if spawned.is_ok() {
            self.image_job = Some(ImageJob { index, done });
        }
    }

    /// Hands a finished snapshot image to Raft (which drops it if its
    /// snapshot changed meanwhile, and asks again).
    fn poll_image(&mut self) {
        let Some(job) = &self.image_job else {
            return;
        };
        let index = job.index;
        match job.done.try_recv() {
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.image_job = None,
            Ok(r) => {
                self.image_job = None;
                match r {
                    Ok(image) => self.raft.set_snapshot_image(index, image),
                    Err(e) => log_warn!(
                        "group {}: reading the entries for a snapshot at {index}: {e}",
                        self.group
                    ),
                }
            }
        }
    }

    fn write(
        &mut self,
        snapshot: Option<(&crate::consensus::Snapshot, &[Entry])>,
        truncate_from: Option<Index>,
        entries: &[Entry],
        hard_state: Option<crate::consensus::HardState>,
    ) -> Result<Ticket, WalError> {
        // The highest ticket of the writes queued here (0: none; a
        // snapshot is durable once `install_snapshot` returns).
        let mut ticket = 0;
        if let Some((s, below)) = snapshot {
            // A snapshot of our own being written goes to the slot the
            // install writes: wait for it, and drop it (this one is newer).
            if let Some(job) = self.snapshot_job.take() {
                let _ = job.done.recv();
            }
            self.snapshot_written = None;
            self.wal.install_snapshot(s, below)?;
            self.reported = (s.index, s.term);
            self.raft.persisted(s.index, s.term);
        }
        if truncate_from.is_some() || !entries.is_empty() {
            ticket = self.wal.append(truncate_from, entries)?;
        }
        if let Some(hs) = hard_state {
            ticket = ticket.max(self.wal.set_hard_state(hs)?);
        }
        Ok(ticket)
    }

    fn apply(&mut self, e: &Entry) {
        // In log order, each once: a gap or a repeat would leave this
        // replica's state different from every other's at the same index.
        assert_eq!(
            e.index,
            self.applied + 1,
            "group {}: applying {} after {}",
            self.group,
            e.index,
            self.applied
        );
        self.applied = e.index;
        let mut outcome = WaiterAnswer::Index(Ok(e.index));
        if let Payload::Normal(payload) = &e.payload {
            if let Some((client, seq, bytes)) = decode_command_entry(payload) {
                outcome = WaiterAnswer::State(self.apply_command(e.index, client, seq, bytes));
            }
        }
        if let (Payload::Normal(payload), WaiterAnswer::Index(outcome)) = (&e.payload, &mut outcome)
        {
            let data = match decode_client_entry(payload) {
                Some((client, seq, data)) => {
                    match self.dedup.apply(client, seq, e.index, fingerprint(data)) {
                        Applied::New => Some(data),
                        Applied::Duplicate(at) => {
                            *outcome = Ok(at);
                            self.not_applied.insert(e.index);
                            None
                        }
                        Applied::Conflict(applied_at) => {
                            *outcome = Err(ProposeError::Conflict { applied_at });
                            self.not_applied.insert(e.index);
                            None
                        }
                        Applied::Forgotten => {
                            self.not_applied.insert(e.index);
                            *outcome = Err(ProposeError::SeqForgotten {
                                client_id: client,
                                seq,
                            });
                            None
                        }
                    }
                }
                None => Some(&payload[..]),
            };
            if let Some(d) = data {
                self.applied_hash = fnv(self.applied_hash, d);
            }
        }
        // Everything at or below the applied index is decided: a waiter
        // whose entry was replaced by another term's learns it failed.
        while let Some(entry) = self.waiters.first_entry() {
            if *entry.key() > e.index {
                break;
            }
            let (index, w) = entry.remove_entry();
            if index != e.index || w.term != e.term {
                w.reply.fail(ProposeError::Lost);
                continue;
            }
            match (w.reply, &outcome) {
                (WaiterReply::Index(r), WaiterAnswer::Index(o)) => r(o.clone()),
                (WaiterReply::State(r), WaiterAnswer::State(o)) => {
                    let mut o = o.clone();
                    if let Ok(out) = &mut o {
                        if let Err(i) = out.fill(&mut payload_at(&self.raft, &mut self.wal)) {
                            self.snapshot_stats.unreadable_entries += 1;
                            o = Err(stored_missing(self.group, i));
                        }
                    }
                    r(o)
                }
                (r, _) => r.fail(ProposeError::Internal(
                    "the entry applied is not the kind proposed".into(),
                )),
            }
        }
    }

    /// Applies a ledger or queue command entry. A retry (same client and
    /// seq) is not applied again: it is answered as the first one was, as
    /// far as the state still tells (see `retry_outcome`).
    fn apply_command(
        &mut self,
        index: Index,
        client: u64,
        seq: u64,
        bytes: &[u8],
    ) -> Result<Outcome, ProposeError> {
        let Some(command) = Command::decode(bytes) else {
            // The leader encoded it, so only a bug or a corrupt entry that
            // passed its checksum gets here: every replica refuses alike.
            return Err(ProposeError::Refused(StateError::Invalid));
        };
        if client != 0 {
            match self
                .dedup
                .apply(client, seq, index, command_fingerprint(&command, bytes))
            {
                Applied::New => {}
                Applied::Duplicate(at) => return Ok(self.retry_outcome(&command, at)),
                Applied::Conflict(applied_at) => return Err(ProposeError::Conflict { applied_at }),
                Applied::Forgotten => {
                    return Err(ProposeError::SeqForgotten {
                        client_id: client,
                        seq,
                    })
                }
            }
        }
        self.machine
            .apply(index, &command)
            .map_err(ProposeError::Refused)
    }

    /// The outcome of a retried command first applied at `at`, rebuilt
    /// from the state (no outcome is stored): an add answers the entry id
    /// it got, a create the ledger's id; a consume answers no messages (the
    /// first handed some out; they return after their visibility timeout).
    fn retry_outcome(&self, command: &Command, at: Index) -> Outcome {
        let ledgers = self.machine.ledgers();
        match command {
            Command::AddEntry { ledger, .. } => match ledgers.entry_added_at(*ledger, at) {
                Some(id) => Outcome::EntryAdded(id),
                None => Outcome::Done,
            },
            Command::CreateLedger { .. } => match ledgers.created_at(at) {
                Some(id) => Outcome::LedgerCreated(id),
                None => Outcome::Done,
            },
            Command::CloseLedger { ledger, .. } | Command::OpenRecover { ledger } => {
                Outcome::Sealed(
                    ledgers
                        .info(*ledger)
                        .ok()
                        .and_then(|l| l.length.checked_sub(1)),
                )
            }
            Command::SetLac { ledger, .. } => {
                Outcome::Lac(ledgers.lac(*ledger).ok().flatten().unwrap_or(0))
            }
            Command::Consume { .. } => Outcome::Consumed(Vec::new()),
            Command::Ack { .. } => Outcome::Acked(0),
            Command::Produce { .. }
            | Command::DeleteLedger { .. }
            | Command::CreateQueue { .. }
            | Command::DeleteQueue { .. } => Outcome::Done,
        }
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
            w.reply.fail(ProposeError::LogStopped(why.clone()));
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
        for (_, _, _, _, reply) in std::mem::take(&mut self.log_tails) {
            reply(Err(ProposeError::LogStopped(why.clone())));
        }
        self.held.clear();
        self.stopped = Some(why);
    }

    /// Committed entries from `from` on, at most `max_entries` and about
    /// `max_bytes` (at least one), as (index, term, data): the data of
    /// client appends without their header; no-ops, membership changes
    /// and ledger or queue commands are skipped. Only what is committed is served.
    pub(crate) fn read(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Index, Term, Vec<u8>)>, ProposeError> {
        if let Some(why) = &self.stopped {
            return Err(ProposeError::LogStopped(why.clone()));
        }
        // Up to what is applied, not committed: only apply knows which
        // entries are retries to skip.
        let commit = self.raft.commit_index().min(self.applied);
        let first = self.raft.first_index().max(1);
        if from < first {
            return Err(ProposeError::Compacted { first });
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut at = from;
        while at <= commit && out.len() < max_entries && (out.is_empty() || bytes < max_bytes) {
            let hi = commit.min(at + max_entries as u64 - 1);
            let entries = self
                .wal
                .read(at, hi)
                .map_err(|e| ProposeError::Unreadable(format!("reading the log: {e}")))?;
            if entries.is_empty() {
                break;
            }
            for e in entries {
                at = e.index + 1;
                if self.not_applied.contains(&e.index) {
                    continue;
                }
                if let Payload::Normal(p) = e.payload {
                    if decode_command_entry(&p).is_some() {
                        continue; // a ledger or queue command, not an append
                    }
                    let data = match decode_client_entry(&p) {
                        Some((_, _, d)) => d.to_vec(),
                        None => p,
                    };
                    bytes += data.len();
                    out.push((e.index, e.term, data));
                    if out.len() >= max_entries || bytes >= max_bytes {
                        break;
                    }
                }
            }
        }
        Ok(out)
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

/// The error for state that refers to a log entry this node cannot read
/// back: never expected (the log keeps what the state refers to).
fn stored_missing(group: GroupId, index: Index) -> ProposeError {
    let why = format!(
        "group {group}: the state refers to log entry {index}, which this node cannot read"
    );
    log_error!("{why}");
    ProposeError::Unreadable(why)
}

/// The answer for a proposal or read-index round the Raft core refused.
fn refused_by_raft(e: crate::consensus::RaftError) -> ProposeError {
    use crate::consensus::RaftError as E;
    match e {
        E::NotLeader { leader } => ProposeError::NotLeader(leader),
        E::InvalidMembershipChange(why) => ProposeError::Invalid(why),
        E::MembershipChangePending | E::TransferInProgress => ProposeError::Busy(e.to_string()),
        // Only compaction and snapshots name an index; a proposal never.
        E::InvalidIndex(_) => ProposeError::Internal(e.to_string()),
    }
}

/// The payload of the log entry at an index: from Raft's log in memory,
/// else read back from the segments (entries below the snapshot that the
/// state refers to).
fn payload_at<'a>(raft: &'a Raft, wal: &'a mut Wal) -> impl FnMut(Index) -> Option<Vec<u8>> + 'a {
    move |i| match raft.entry(i) {
        // Only the payload is copied, not the entry.
        Some(e) => match &e.payload {
            Payload::Normal(p) => Some(p.clone()),
            _ => None,
        },
        None => match wal.read(i, i).ok()?.pop()?.payload {
            Payload::Normal(p) => Some(p),
            _ => None,
        },
    }
}

/// Makes the calling (snapshot) thread yield the CPU and the disk to the
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

/// FNV-1a over `data`, continuing from `h`.
fn fnv(mut h: u64, data: &[u8]) -> u64 {
    if h == 0 {
        h = 0xcbf2_9ce4_8422_2325;
    }
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
