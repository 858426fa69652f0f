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

use super::tap::MissingFound;
use super::{refused_by_raft, Replica};
use crate::consensus::{Entry, Index, Payload, Raft, Role, Term};
use crate::node::command::{ClientTicket, ProposeError, Reply, StateReply, TicketDone};
use crate::node::log::{log_error, log_warn};
use crate::node::loops::host::Host;
use crate::state::dedup::{
    address_index, client_records, fingerprint, fingerprint_of_crc, record_address, Applied,
    ClientRecords, DedupTable, RECORD_SLOT_BITS,
};
use crate::state::query::command_records;
use crate::state::Stored;
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
    /// `Index` or a `Ticket`, answered with its record's address; or the
    /// commands of a command batch entry, each a `State` or a
    /// `CommandTicket`, answered with its outcome.
    Records(Vec<WaiterReply>),
    /// A ledger or queue command of a connection served on its group's
    /// loop, whose outcome needs no bytes filled in from the log (not a
    /// consume): it goes to `take_command_done`, or its failure to
    /// `take_client_done`.
    CommandTicket(ClientTicket),
}

impl WaiterReply {
    /// Answers with `why`; a ticket's answer goes to `done`.
    pub(super) fn fail(self, why: ProposeError, done: &mut Vec<TicketDone>) {
        match self {
            WaiterReply::Index(r) => r(Err(why)),
            WaiterReply::State(r) => r(Err(why)),
            WaiterReply::Ticket(t) | WaiterReply::CommandTicket(t) => done.push((t, Err(why))),
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
    Records(Vec<Result<u64, ProposeError>>),
    /// Each command's, in slot order (one for a single-command entry).
    States(Vec<Result<Outcome, ProposeError>>),
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Proposes client data; the reply comes once it is applied.
    pub(crate) fn propose(&mut self, data: Vec<u8>, reply: Reply) {
        self.propose_entry(data, WaiterReply::Index(reply));
    }

    fn propose_entry(&mut self, data: Vec<u8>, reply: WaiterReply) {
        self.propose_gathered();
        self.propose_now(data, reply);
    }

    pub(super) fn propose_now(&mut self, data: Vec<u8>, reply: WaiterReply) {
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
            if let Some(commands) = command_records(payload) {
                let (outcomes, referred) = self.apply_commands(e.index, commands);
                if referred {
                    let check = EntryCheck {
                        term: e.term,
                        crc: crc32c::crc32c(payload),
                    };
                    // After a batch's last command, which may have
                    // released what an earlier one referred to (asked only
                    // of batches: `oldest_stored` walks every ledger).
                    if outcomes.len() > 1 {
                        self.machine.record_check_after_entry(e.index, check);
                    } else {
                        self.machine.record_check(e.index, check);
                    }
                }
                outcome = WaiterAnswer::States(outcomes);
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
                (WaiterReply::Records(rs), WaiterAnswer::States(os)) if rs.len() == os.len() => {
                    for (r, o) in rs.into_iter().zip(os.drain(..)) {
                        match r {
                            WaiterReply::State(r) => self.answer_outcome(o, r),
                            WaiterReply::CommandTicket(t) => match o {
                                Ok(o) => self.command_done.push((t, o)),
                                Err(e) => self.client_done.push((t, Err(e))),
                            },
                            r => r.fail(
                                ProposeError::Internal(
                                    "the entry applied is not the kind proposed".into(),
                                ),
                                &mut self.client_done,
                            ),
                        }
                    }
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

    /// Applies the commands of the command entry at `index`, in slot
    /// order, each as if it were an entry of its own. One outcome per
    /// command, in slot order, and whether one of them (applied, not a
    /// retry answered from the state) left the state referring to the
    /// entry's bytes.
    fn apply_commands(
        &mut self,
        index: Index,
        commands: ClientRecords<'_>,
    ) -> (Vec<Result<Outcome, ProposeError>>, bool) {
        let commands: Vec<_> = commands.collect();
        let order = super::planted::command_order(&commands, self.planted_workload);
        let mut outcomes: Vec<_> = (0..commands.len()).map(|_| None).collect();
        let mut referred = false;
        for slot in order {
            let (client, seq, bytes) = commands[slot];
            let (outcome, applied) = self.apply_command(index, slot, client, seq, bytes);
            referred |= applied && refers_to_its_entry(&outcome);
            outcomes[slot] = Some(outcome);
        }
        let outcomes = outcomes
            .into_iter()
            .map(|o| o.expect("every slot applied"))
            .collect();
        (outcomes, referred)
    }

    /// Applies command `slot` of the command entry at `index`, and says
    /// whether it reached the machine. A retry (same client and seq) is
    /// not applied again: it is answered as the first one was, as far as
    /// the state still tells (see `retry_outcome`).
    fn apply_command(
        &mut self,
        index: Index,
        slot: usize,
        client: u64,
        seq: u64,
        bytes: &[u8],
    ) -> (Result<Outcome, ProposeError>, bool) {
        let Some(command) = Command::decode(bytes) else {
            // The leader encoded it, so only a bug or a corrupt entry that
            // passed its checksum gets here: every replica refuses alike.
            return (Err(ProposeError::Refused(StateError::Invalid)), false);
        };
        if client != 0 {
            // Recorded at its address (its entry's index and its slot),
            // as appends are, so one client's requests are in one order
            // in the table.
            let address = record_address(index, slot);
            match self
                .dedup
                .apply(client, seq, address, command_fingerprint(&command, bytes))
            {
                Applied::New => {}
                Applied::Duplicate(at) => {
                    return (self.retry_outcome(&command, command_place(at)), false)
                }
                Applied::Conflict(at) => {
                    let applied_at = address_index(at);
                    return (Err(ProposeError::Conflict { applied_at }), false);
                }
                Applied::Forgotten => {
                    let why = ProposeError::SeqForgotten {
                        client_id: client,
                        seq,
                    };
                    return (Err(why), false);
                }
            }
        }
        let at = Stored::at(index, slot, 0);
        let outcome = super::planted::apply_command(
            &mut self.machine,
            at,
            slot,
            &command,
            self.planted_workload,
        )
        .map_err(ProposeError::Refused);
        (outcome, true)
    }

    /// The outcome of a retried command first applied at `at`, rebuilt
    /// from the state (no outcome is stored): an add answers the entry id
    /// it got (or, if it added nothing to a ledger that still exists, the
    /// refusal it met: refusals of an add last), a create the ledger's id; a consume answers no messages
    /// (the first handed some out; they return after their visibility
    /// timeout).
    fn retry_outcome(&self, command: &Command, at: Stored) -> Result<Outcome, ProposeError> {
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
            // A pipelined produce (deduplicated by client and seq too):
            // its ids while the producer's window holds them. Otherwise
            // the first try was refused, or its ids are forgotten: never
            // an outcome that reads as success.
            Command::Produce {
                queue,
                producer_id,
                seq,
                ..
            } => match self.machine.queues().produced(queue, *producer_id, *seq) {
                Some(ids) => Outcome::Produced { ids, retry: true },
                None if self.machine.queues().is_acked(queue, 0).is_err() => {
                    return Err(ProposeError::Refused(StateError::NoSuchQueue))
                }
                None => return Err(ProposeError::Refused(StateError::Forgotten)),
            },
            Command::ProduceUncounted { .. }
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

/// Where the command recorded at dedup `address` is in the log.
fn command_place(address: u64) -> Stored {
    let slot = address & ((1 << RECORD_SLOT_BITS) - 1);
    Stored::at(address_index(address), slot as usize, 0)
}

/// Whether an applied command's outcome left the state referring to its
/// entry's bytes (a ledger entry added, messages produced): the outcomes
/// whose entry check the state records, alike on every replica. A retry
/// answered from the state never counts: its bytes are the first try's
/// entry's, and the machine did not apply it.
fn refers_to_its_entry(outcome: &Result<Outcome, ProposeError>) -> bool {
    match outcome {
        Ok(Outcome::EntryAdded(_)) => true,
        Ok(Outcome::Produced { ids, retry }) => !retry && !ids.is_empty(),
        _ => false,
    }
}
