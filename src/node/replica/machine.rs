//! The replicated state-machine policy of a replica: what a proposal puts
//! in the log (client appends with their client id and seq, ledger and
//! queue commands stamped with the leader's clock, membership changes,
//! with the admission checks before them), and what applying a committed
//! entry does, identically on every replica: the dedup table answers a
//! retry with the first outcome and keeps it from applying twice, the
//! applied hash folds in each applied append, commands change the ledgers
//! and queues, and each waiter is answered. Also the restore of that state
//! from a snapshot's data, and the log entries it refers to (read back
//! from the segments below Raft's log). Runs on the loop, reads no clock.

use super::super::command::{ClientTicket, ProposeError, Reply, StateReply, TicketDone};
use super::super::host::Host;
use super::super::log::{log_error, log_warn};
use super::tap::{MissingFound, WorkloadBug};
use super::{refused_by_raft, Replica};
use crate::consensus::{Entry, Index, Payload, Raft, Role, Term};
use crate::state::dedup::{
    address_index, begin_client_batch, client_records, fingerprint, fingerprint_of_crc,
    push_client_record, record_address, Applied, ClientRecords, DedupTable,
    CLIENT_BATCH_HEADER_BYTES, CLIENT_RECORD_HEADER_BYTES, RECORDS_PER_ENTRY_MAX,
};
use crate::state::query::{decode_command_entry, encode_command_entry};
use crate::state::{Command, EntryCheck, Error as StateError, Lookup, Outcome, StateMachine};
use crate::storage::{LogDir, Wal, WalError};
use crate::transport::GroupId;
use std::collections::BTreeSet;

/// A learner is caught up, and may be promoted to voter without `force`,
/// when its match index (on the leader) is at most this many entries
/// below the leader's last index. Small: a few batches in flight at the
/// moment of promotion, which a voter that starts counting in quorums
/// fetches within one round trip, so no commit waits on it for long.
pub const LEARNER_CAUGHT_UP_ENTRIES_MAX: u64 = 64;

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
pub(super) struct Waiter {
    pub(super) term: Term,
    pub(super) reply: WaiterReply,
}

/// What a waiter wants to hear: the index its entry was applied at, or
/// the state machine's outcome.
pub(super) enum WaiterReply {
    Index(Reply),
    State(StateReply),
    /// A client connection on a loop: the index goes to `client_done`.
    Ticket(ClientTicket),
    /// The records of a client batch entry, in slot order: each an
    /// `Index` or a `Ticket`, answered with its record's address.
    Records(Vec<WaiterReply>),
}

impl WaiterReply {
    /// Answers with `why`; a ticket's answer goes to `done`.
    pub(super) fn fail(self, why: ProposeError, done: &mut Vec<TicketDone>) {
        match self {
            WaiterReply::Index(r) => r(Err(why)),
            WaiterReply::State(r) => r(Err(why)),
            WaiterReply::Ticket(t) => done.push((t, Err(why))),
            WaiterReply::Records(rs) => {
                for r in rs {
                    r.fail(why.clone(), done);
                }
            }
        }
    }

    /// How many client requests (records) this answers.
    pub(super) fn count(&self) -> u64 {
        match self {
            WaiterReply::Records(rs) => rs.iter().map(WaiterReply::count).sum(),
            _ => 1,
        }
    }

    /// The planted `StepDownAnswersOk`: answers success for an entry at
    /// `index` that has not applied (and may never).
    pub(super) fn planted_ok(self, index: Index, done: &mut Vec<TicketDone>) {
        match self {
            WaiterReply::State(r) => r(Ok(Outcome::Done)),
            WaiterReply::Records(rs) => {
                for (slot, r) in rs.into_iter().enumerate() {
                    r.answer(Ok(record_address(index, slot)), done);
                }
            }
            r => r.answer(Ok(record_address(index, 0)), done),
        }
    }

    /// Answers with `outcome`: an index, an address or a failure (not a
    /// state-machine outcome).
    fn answer(self, outcome: Result<Index, ProposeError>, done: &mut Vec<TicketDone>) {
        match self {
            WaiterReply::Index(r) => r(outcome),
            WaiterReply::Ticket(t) => done.push((t, outcome)),
            other => other.fail(
                ProposeError::Internal("the entry applied is not the kind proposed".into()),
                done,
            ),
        }
    }
}

/// What applying an entry answers its waiter: the index (a membership
/// change) or the address (raw data), the state machine's outcome (a
/// command), or each record's address (client appends); the kind matches
/// the waiter's `WaiterReply`.
enum WaiterAnswer {
    Index(Result<Index, ProposeError>),
    State(Result<Outcome, ProposeError>),
    Records(Vec<Result<u64, ProposeError>>),
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Proposes a client append with its client id and sequence number:
    /// applied once however often it is retried; the reply is the address
    /// it was applied at (the original one for a retry). Gathered with
    /// this turn's other appends into one entry (`propose_gathered`).
    pub(crate) fn propose_client(&mut self, client_id: u64, seq: u64, data: &[u8], reply: Reply) {
        let mut reply = Some(reply);
        self.gather(client_id, seq, &[data], |_| {
            WaiterReply::Index(reply.take().expect("one record"))
        });
    }

    /// `propose_client` for a connection served on a loop: the outcome
    /// goes to `take_client_done` with `ticket`, no callback.
    pub(crate) fn propose_client_ticket(
        &mut self,
        client_id: u64,
        seq: u64,
        data: &[u8],
        ticket: ClientTicket,
    ) {
        self.gather(client_id, seq, &[data], |_| WaiterReply::Ticket(ticket));
    }

    /// The records of one `AppendBatch` as client `client_id`'s
    /// `first_seq..`: all in one entry, so their addresses are
    /// consecutive; record `k`'s outcome goes to `take_client_done` with
    /// `ticket` whose `item` is `ticket.item + k`.
    pub(crate) fn propose_client_batch<T: AsRef<[u8]>>(
        &mut self,
        client_id: u64,
        first_seq: u64,
        items: &[T],
        ticket: ClientTicket,
    ) {
        self.gather(client_id, first_seq, items, |k| {
            WaiterReply::Ticket(ClientTicket {
                item: ticket.item + k as u32,
                ..ticket
            })
        });
    }

    /// Adds `items` (seqs `first_seq..`) to this turn's client batch
    /// entry, starting another first if they do not fit beside what it
    /// holds; refuses them all if they cannot fit in one entry.
    fn gather<T: AsRef<[u8]>>(
        &mut self,
        client_id: u64,
        first_seq: u64,
        items: &[T],
        mut reply_for: impl FnMut(usize) -> WaiterReply,
    ) {
        let bytes: usize = items
            .iter()
            .map(|d| CLIENT_RECORD_HEADER_BYTES + d.as_ref().len())
            .sum();
        let refused = if let Some(why) = &self.stopped {
            Some(ProposeError::LogStopped(why.clone()))
        } else if CLIENT_BATCH_HEADER_BYTES + bytes > self.entry_bytes_max {
            Some(ProposeError::TooLarge {
                bytes: CLIENT_BATCH_HEADER_BYTES + bytes,
                max: self.entry_bytes_max,
            })
        } else if items.len() > RECORDS_PER_ENTRY_MAX {
            Some(ProposeError::Invalid(format!(
                "{} records in one batch, at most {RECORDS_PER_ENTRY_MAX}",
                items.len()
            )))
        } else {
            None
        };
        if let Some(why) = refused {
            for k in 0..items.len() {
                reply_for(k).fail(why.clone(), &mut self.client_done);
            }
            return;
        }
        let full = self.gathered.len() + bytes > self.entry_bytes_max
            || self.gathered_replies.len() + items.len() > RECORDS_PER_ENTRY_MAX;
        if full {
            self.propose_gathered();
        }
        if self.gathered.is_empty() {
            // About the last entry's size: growing by doubling instead
            // copied each turn's records twice more (memmove was 4.6% of a
            // leader's samples).
            let hint = self
                .gathered_bytes_last
                .max(bytes)
                .min(self.entry_bytes_max);
            self.gathered.reserve(CLIENT_BATCH_HEADER_BYTES + hint);
            begin_client_batch(&mut self.gathered);
        }
        for (k, data) in items.iter().enumerate() {
            let seq = first_seq.wrapping_add(k as u64);
            push_client_record(&mut self.gathered, client_id, seq, data.as_ref());
            self.gathered_replies.push(reply_for(k));
        }
    }

    /// Proposes the client appends gathered since the last call as one
    /// entry (nothing if there are none). Called at the start of every
    /// `drive`, and before any other proposal, so entries keep the order
    /// their requests came in.
    pub(super) fn propose_gathered(&mut self) {
        if self.gathered_replies.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.gathered);
        self.gathered_bytes_last = data.len();
        let replies = std::mem::take(&mut self.gathered_replies);
        self.propose_now(data, WaiterReply::Records(replies));
    }

    /// The outcomes of ticketed appends since the last call, moved into
    /// `into` (which the caller reuses, so no allocation per turn).
    pub(crate) fn take_client_done(&mut self, into: &mut Vec<TicketDone>) {
        into.append(&mut self.client_done);
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
        if let (Some(WorkloadBug::AckNotReplicated), Command::Ack { ids, .. }, Role::Leader) =
            (self.planted_workload, &command, self.raft.role())
        {
            reply(Ok(Outcome::Acked(ids.len() as u64)));
            return;
        }
        let entry = encode_command_entry(client_id, seq, &command.encode());
        self.propose_entry(entry, WaiterReply::State(reply));
    }

    fn propose_entry(&mut self, data: Vec<u8>, reply: WaiterReply) {
        self.propose_gathered();
        self.propose_now(data, reply);
    }

    fn propose_now(&mut self, data: Vec<u8>, reply: WaiterReply) {
        if let Some(why) = &self.stopped {
            reply.fail(ProposeError::LogStopped(why.clone()), &mut self.client_done);
            return;
        }
        if data.len() > self.entry_bytes_max {
            let why = ProposeError::TooLarge {
                bytes: data.len(),
                max: self.entry_bytes_max,
            };
            reply.fail(why, &mut self.client_done);
            return;
        }
        match self.wal.admit() {
            Ok(()) => {}
            Err(WalError::DiskFull) => {
                reply.fail(ProposeError::DiskFull, &mut self.client_done);
                return;
            }
            Err(e) => {
                // The log failed (retrying a segment hit an I/O error):
                // this group stops here, as when a flush fails.
                let why = format!("{e}");
                reply.fail(ProposeError::LogStopped(why.clone()), &mut self.client_done);
                self.stop(why);
                return;
            }
        }
        match self.raft.propose(data) {
            Ok((index, term)) => {
                self.waiters.insert(index, Waiter { term, reply });
            }
            Err(e) => reply.fail(refused_by_raft(e), &mut self.client_done),
        }
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
        self.propose_gathered();
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

    pub(super) fn apply(&mut self, e: &Entry) {
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
        self.note(|| super::tap::Note::Applied { entry: e.clone() });
        self.applied = e.index;
        let mut outcome = WaiterAnswer::Index(Ok(e.index));
        if let Payload::Normal(payload) = &e.payload {
            if let Some((client, seq, bytes)) = decode_command_entry(payload) {
                let applied = self.apply_command(e.index, client, seq, bytes);
                if refers_to_its_entry(&applied) {
                    let check = EntryCheck {
                        term: e.term,
                        crc: crc32c::crc32c(payload),
                    };
                    self.machine.record_check(e.index, check);
                }
                outcome = WaiterAnswer::State(applied);
            } else if let Some(records) = client_records(payload) {
                outcome = WaiterAnswer::Records(self.apply_records(e.index, records));
            } else {
                // Raw data (`propose`): one record at slot 0.
                let c = crc32c::crc32c(payload);
                self.applied_hash = chain_hash(self.applied_hash, c, payload.len());
                outcome = WaiterAnswer::Index(Ok(record_address(e.index, 0)));
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
                w.reply.fail(ProposeError::Lost, &mut self.client_done);
                continue;
            }
            let done = &mut self.client_done;
            match (w.reply, &mut outcome) {
                (WaiterReply::Records(rs), WaiterAnswer::Records(os)) if rs.len() == os.len() => {
                    for (r, o) in rs.into_iter().zip(os.drain(..)) {
                        r.answer(o, done);
                    }
                }
                (r @ (WaiterReply::Index(_) | WaiterReply::Ticket(_)), WaiterAnswer::Index(o)) => {
                    r.answer(o.clone(), done)
                }
                (WaiterReply::State(r), WaiterAnswer::State(o)) => {
                    self.answer_outcome(o.clone(), r)
                }
                (r, _) => r.fail(
                    ProposeError::Internal("the entry applied is not the kind proposed".into()),
                    done,
                ),
            }
        }
    }

    /// Applies the client records of the entry at `index`, each at its
    /// address: the dedup table answers a retry with the first address
    /// (and keeps it out of reads), the applied hash folds in the rest.
    /// One outcome per record, in slot order.
    fn apply_records(
        &mut self,
        index: Index,
        records: ClientRecords<'_>,
    ) -> Vec<Result<u64, ProposeError>> {
        let mut outcomes = Vec::new();
        for (slot, (client, seq, data)) in records.enumerate() {
            let address = record_address(index, slot);
            // One CRC32C of the record's bytes serves the dedup
            // fingerprint and the applied hash.
            let crc = crc32c::crc32c(data);
            let fp = fingerprint_of_crc(crc, data.len());
            let (outcome, applies) = match self.dedup.apply(client, seq, address, fp) {
                Applied::New => (Ok(address), true),
                Applied::Duplicate(at) => {
                    self.note(|| super::tap::Note::Deduplicated { address });
                    let (answer, again) = super::planted::duplicate(address, at, self.planted);
                    (Ok(answer), again)
                }
                Applied::Conflict(applied_at) => {
                    (Err(ProposeError::Conflict { applied_at }), false)
                }
                Applied::Forgotten => (
                    Err(ProposeError::SeqForgotten {
                        client_id: client,
                        seq,
                    }),
                    false,
                ),
            };
            if applies {
                self.applied_hash = chain_hash(self.applied_hash, crc, data.len());
            } else {
                self.not_applied.insert(address);
            }
            outcomes.push(outcome);
        }
        outcomes
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
            // Recorded at its entry's address (slot 0), as appends are,
            // so one client's requests are in one order in the table.
            let address = record_address(index, 0);
            match self
                .dedup
                .apply(client, seq, address, command_fingerprint(&command, bytes))
            {
                Applied::New => {}
                Applied::Duplicate(at) => return self.retry_outcome(&command, address_index(at)),
                Applied::Conflict(at) => {
                    return Err(ProposeError::Conflict {
                        applied_at: address_index(at),
                    })
                }
                Applied::Forgotten => {
                    return Err(ProposeError::SeqForgotten {
                        client_id: client,
                        seq,
                    })
                }
            }
        }
        super::planted::apply_command(&mut self.machine, index, &command, self.planted_workload)
            .map_err(ProposeError::Refused)
    }

    /// The outcome of a retried command first applied at `at`, rebuilt
    /// from the state (no outcome is stored): an add answers the entry id
    /// it got (or, if it added nothing to a ledger that still exists, the
    /// refusal it met: refusals of an add last), a create the ledger's id; a consume answers no messages
    /// (the first handed some out; they return after their visibility
    /// timeout).
    fn retry_outcome(&self, command: &Command, at: Index) -> Result<Outcome, ProposeError> {
        let ledgers = self.machine.ledgers();
        Ok(match command {
            Command::AddEntry {
                ledger,
                writer_token,
                data,
            } => match ledgers.entry_added_at(*ledger, at) {
                Some(id) => Outcome::EntryAdded(id),
                // Deleted since: whether the first add took went with it.
                None if ledgers.info(*ledger).is_err() => Outcome::Done,
                None => {
                    let refusal = ledgers.add_refusal(*ledger, *writer_token, data.len());
                    return Err(ProposeError::Refused(
                        refusal.unwrap_or(StateError::Invalid),
                    ));
                }
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
            | Command::ProduceUncounted { .. }
            | Command::DeleteLedger { .. }
            | Command::CreateQueue { .. }
            | Command::DeleteQueue { .. } => Outcome::Done,
        })
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
        self.not_applied = self.not_applied.split_off(&record_address(index + 1, 0));
        self.set_keep_from(index, machine.oldest_stored());
        self.machine = machine;
        true
    }

    /// At start and after a snapshot install: finds the log entries below
    /// Raft's log that the state refers to and the log cannot read (a
    /// damaged or lost segment below the snapshot), and has them repaired
    /// from a peer (`repair`).
    pub(crate) fn check_stored_entries(&mut self, found: MissingFound) {
        self.forget_held();
        let in_memory_from = self.raft.first_index();
        let mut missing = BTreeSet::new();
        let wal = &self.wal;
        self.machine.each_stored(&mut |i| {
            if i < in_memory_from && !wal.holds(i) {
                missing.insert(i);
            }
        });
        self.snapshot_stats.unreadable_entries = missing.len() as u64;
        // The rest of the range a snapshot image carries (from the lowest
        // entry the state at the snapshot refers to): a lost batch took
        // entries nothing refers to as well, which an image still needs.
        let gaps_max = super::repair::REPAIR_GAPS_MAX;
        let gaps = match self.keep_from() {
            Some(from) => self.wal.gaps(from, in_memory_from, gaps_max),
            None => Vec::new(),
        };
        if gaps.len() >= gaps_max {
            log_warn!(
                "group {}: at least {gaps_max} log entries below the snapshot are missing here: repairing the first {gaps_max}; snapshot images need them all: replace this log (HARDWARE.md, \"Replacing a disk\")",
                self.group
            );
        }
        self.note_missing(missing, found, true);
        self.note_missing(gaps, found, false);
    }
}

/// The error for state that refers to a log entry this node cannot read
/// back: never expected (the log keeps what the state refers to).
pub(super) fn stored_missing(group: GroupId, index: Index) -> ProposeError {
    let why = format!(
        "group {group}: the state refers to log entry {index}, which this node cannot read"
    );
    log_error!("{why}");
    ProposeError::Unreadable(why)
}

/// The payload of the log entry at an index: from Raft's log in memory,
/// else read back from the segments, waiting for the disk (entries below
/// the snapshot that the state refers to). For the simulator's final
/// checks, never the loop (which parks answers instead: `cold`).
pub(crate) fn payload_at<'a, D: LogDir>(
    raft: &'a Raft,
    wal: &'a mut Wal<D>,
) -> impl FnMut(Index) -> Lookup + 'a {
    move |i| {
        let payload = match raft.entry(i) {
            Some(e) => e.payload.clone(),
            None => match wal.read(i, i).ok().and_then(|mut es| es.pop()) {
                Some(e) => e.payload,
                None => return Lookup::Missing,
            },
        };
        match payload {
            Payload::Normal(p) => Lookup::Payload(p),
            _ => Lookup::Missing,
        }
    }
}

/// The running hash of applied data, continued from `h` with a record
/// of `len` bytes whose CRC32C (hardware, GB/s) is `crc`: both mixed into
/// the chain. It replaced a byte-at-a-time FNV-1a that was 9% of a node's
/// CPU at 25k appends/s of 1 KiB. Replicas compare it; it is no MAC.
fn chain_hash(h: u64, crc: u32, len: usize) -> u64 {
    let entry = u64::from(crc) | (len as u64) << 32;
    (h ^ entry)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
        ^ 0xcbf2_9ce4_8422_2325
}

/// Whether a command's outcome left the state referring to its entry's
/// bytes (a ledger entry added, messages produced, not a retry's): the
/// outcomes whose entry check the state records, alike on every replica.
fn refers_to_its_entry(outcome: &Result<Outcome, ProposeError>) -> bool {
    match outcome {
        Ok(Outcome::EntryAdded(_)) => true,
        Ok(Outcome::Produced { ids, retry }) => !retry && !ids.is_empty(),
        _ => false,
    }
}
