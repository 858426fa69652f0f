//! The ledger and queue state machine: commands, their binary encoding,
//! `apply` and snapshots. Every replica applies the same committed entries
//! in the same order and ends in the same state, so nothing here does I/O,
//! reads a clock or draws a random number: time comes in the commands (the
//! leader's `now_ms`, stamped at proposal), and every map is ordered (a
//! `BTreeMap`, or `imbl`'s persistent `OrdMap` for the ledgers and queues,
//! so a snapshot captures them in O(1)).
//!
//! Call `apply` once per committed entry, in log order, with its index;
//! an index at or below the last applied one is refused unchanged, so a
//! node may replay its log after a restored snapshot. `snapshot` may be
//! called between applies; `restore` rebuilds a machine from its bytes.
//!
//! The state keeps, for every log entry whose bytes it refers to (a
//! ledger entry's, a produce's messages), that entry's term and the
//! CRC32C of its payload ([`EntryCheck`]): what a replica whose copy of
//! such an entry is damaged checks a copy fetched from a peer against
//! before it takes it. Checks of entries no longer referred to are
//! dropped as the references go, so every replica holds the same ones.

use super::ledger::{Ledgers, ENTRY_BYTES_MAX};
use super::queue::{
    Delivery, Queues, ACK_IDS_MAX, MESSAGE_BYTES_MAX, PRODUCE_MESSAGES_MAX, QUEUE_NAME_BYTES_MAX,
};
use super::stored::Stored;
use super::wire::{put_bytes, put_u32, put_u64, put_u8, Reader};
use crate::consensus::Index;
use std::ops::Range;

/// First bytes of a snapshot (format version 8: metadata only, the bytes
/// of entries and messages stay in the log, placed by index and slot
/// (commands share entries); messages' sizes counted; the entry checks of
/// the entries referred to; a queue's runs may span the one-message
/// produces of consecutive commands).
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"QSM8";
/// The encoding before runs spanned commands, still read (a run per
/// produce at least: 36 bytes for each one-message produce).
const SNAPSHOT_MAGIC_QSM7: [u8; 4] = *b"QSM7";
/// The encoding before command batch entries, still read (every ledger
/// entry and ledger creation at slot 0 of its log entry).
const SNAPSHOT_MAGIC_QSM6: [u8; 4] = *b"QSM6";
/// The encoding before entry checks, still read (a state restored from
/// it has none: its referenced entries cannot be verified).
const SNAPSHOT_MAGIC_QSM5: [u8; 4] = *b"QSM5";
/// The encoding before message sizes, still read (each message counts as
/// `MESSAGE_BYTES_MAX` in a consume's budget).
const SNAPSHOT_MAGIC_QSM4: [u8; 4] = *b"QSM4";
/// The encoding before produce fingerprints, still read (its
/// fingerprints read as 0, "not recorded").
const SNAPSHOT_MAGIC_QSM3: [u8; 4] = *b"QSM3";

/// A state-machine command, as proposed to the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Creates a ledger written by whoever holds `writer_token`.
    CreateLedger {
        /// The writer's token (chosen at random by the client).
        writer_token: u64,
        /// The leader's clock at proposal, in ms (the ledger's `created_ms`).
        now_ms: u64,
    },
    /// Adds an entry to a ledger, by its writer.
    AddEntry {
        /// The ledger's id.
        ledger: u64,
        /// The writer's token.
        writer_token: u64,
        /// The entry's bytes.
        data: Vec<u8>,
    },
    /// Advances a ledger's last-add-confirmed without a new entry.
    SetLac {
        /// The ledger's id.
        ledger: u64,
        /// The writer's token.
        writer_token: u64,
        /// The new LAC (an entry id already added).
        lac: u64,
    },
    /// Closes a ledger by its writer, sealing its last entry.
    CloseLedger {
        /// The ledger's id.
        ledger: u64,
        /// The writer's token.
        writer_token: u64,
    },
    /// Opens a ledger with recovery: fences its writer and seals it.
    OpenRecover {
        /// The ledger's id.
        ledger: u64,
    },
    /// Deletes a ledger.
    DeleteLedger {
        /// The ledger's id.
        ledger: u64,
    },
    /// Creates a queue.
    CreateQueue {
        /// The queue's name (1 to `QUEUE_NAME_BYTES_MAX` bytes of UTF-8).
        name: String,
        /// Deliveries after which a message is dead-lettered.
        max_deliveries: u32,
    },
    /// Deletes a queue and its messages.
    DeleteQueue {
        /// The queue's name.
        name: String,
    },
    /// Produces a batch of messages, idempotent per (producer_id, seq).
    Produce {
        /// The queue's name.
        queue: String,
        /// The producer's id (chosen at random by the client).
        producer_id: u64,
        /// The producer's sequence number for this batch.
        seq: u64,
        /// The messages' bytes.
        messages: Vec<Vec<u8>>,
    },
    /// A produce in the encoding before message sizes counted (opcode 18,
    /// read from logs written then; never written now). Applied as
    /// `Produce`, except that each message counts as
    /// [`MESSAGE_BYTES_MAX`] in a consume's byte budget: a replica that
    /// restored a snapshot of that time cannot know the sizes, and every
    /// replica must hand out the same messages.
    ProduceUncounted {
        /// The queue's name.
        queue: String,
        /// The producer's id.
        producer_id: u64,
        /// The producer's sequence number for this batch.
        seq: u64,
        /// The messages' bytes.
        messages: Vec<Vec<u8>>,
    },
    /// Pulls up to `max` messages, hidden until `now_ms + visibility_ms`.
    Consume {
        /// The queue's name.
        queue: String,
        /// The consumer's id (not kept yet: any consumer may ack any message).
        consumer: u64,
        /// Messages to hand out at most.
        max: u32,
        /// How long the messages stay hidden, in ms (at least 1).
        visibility_ms: u64,
        /// The leader's clock at proposal, in ms.
        now_ms: u64,
    },
    /// Acks messages: they are deleted and never delivered again.
    Ack {
        /// The queue's name.
        queue: String,
        /// The ids to ack.
        ids: Vec<u64>,
    },
}

/// What applying a command returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `CreateLedger`: the new ledger's id.
    LedgerCreated(u64),
    /// `AddEntry`: the entry's id.
    EntryAdded(u64),
    /// `SetLac`: the LAC after it.
    Lac(u64),
    /// `CloseLedger`, `OpenRecover`: the sealed last entry id (`None`: empty).
    Sealed(Option<u64>),
    /// `DeleteLedger`, `CreateQueue`, `DeleteQueue`: done.
    Done,
    /// `Produce`: the batch's ids; `retry` if it had been applied before.
    Produced {
        /// The ids given to the batch, in order.
        ids: Range<u64>,
        /// True if this was a retry answered from the window.
        retry: bool,
    },
    /// `Consume`: the messages handed out.
    Consumed(Vec<Delivery>),
    /// `Ack`: how many ids were newly acked.
    Acked(u64),
}

/// Why a command was refused (the state is unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// No ledger with that id.
    NoSuchLedger,
    /// The token is not the ledger's writer's.
    NotWriter,
    /// The ledger was recovered by someone else: this writer is fenced.
    Fenced,
    /// The ledger was closed by its writer.
    Closed,
    /// `SetLac` past the last entry added.
    LacBeyondEnd,
    /// No queue with that name.
    NoSuchQueue,
    /// A queue with that name exists.
    QueueExists,
    /// A produce's seq is older than the producer's window: it may have
    /// been applied, and its ids are forgotten.
    Forgotten,
    /// A produce retry (same producer and seq) whose messages differ from
    /// those first produced under them: refused, nothing is added.
    Conflict,
    /// A bound was exceeded (named).
    Limit(&'static str),
    /// A bad argument (empty or long name, zero visibility, ...).
    Invalid,
    /// The index was at or below the last applied one.
    AlreadyApplied,
}

/// A snapshot's bytes were not a valid snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadSnapshot;

const CREATE_LEDGER: u8 = 1;
const ADD_ENTRY: u8 = 2;
const SET_LAC: u8 = 3;
const CLOSE_LEDGER: u8 = 4;
const OPEN_RECOVER: u8 = 5;
const DELETE_LEDGER: u8 = 6;
const CREATE_QUEUE: u8 = 16;
const DELETE_QUEUE: u8 = 17;
/// A produce before message sizes counted (`Command::ProduceUncounted`).
const PRODUCE_UNCOUNTED: u8 = 18;
const CONSUME: u8 = 19;
const ACK: u8 = 20;
const PRODUCE: u8 = 21;

impl Command {
    /// Its encoding: a tag byte, then the fields, little-endian, byte
    /// strings and lists with a `u32` length.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let o = &mut out;
        match self {
            Command::CreateLedger {
                writer_token,
                now_ms,
            } => {
                put_u8(o, CREATE_LEDGER);
                put_u64(o, *writer_token);
                put_u64(o, *now_ms);
            }
            Command::AddEntry {
                ledger,
                writer_token,
                data,
            } => {
                put_u8(o, ADD_ENTRY);
                put_u64(o, *ledger);
                put_u64(o, *writer_token);
                put_bytes(o, data);
            }
            Command::SetLac {
                ledger,
                writer_token,
                lac,
            } => {
                put_u8(o, SET_LAC);
                put_u64(o, *ledger);
                put_u64(o, *writer_token);
                put_u64(o, *lac);
            }
            Command::CloseLedger {
                ledger,
                writer_token,
            } => {
                put_u8(o, CLOSE_LEDGER);
                put_u64(o, *ledger);
                put_u64(o, *writer_token);
            }
            Command::OpenRecover { ledger } => {
                put_u8(o, OPEN_RECOVER);
                put_u64(o, *ledger);
            }
            Command::DeleteLedger { ledger } => {
                put_u8(o, DELETE_LEDGER);
                put_u64(o, *ledger);
            }
            Command::CreateQueue {
                name,
                max_deliveries,
            } => {
                put_u8(o, CREATE_QUEUE);
                put_bytes(o, name.as_bytes());
                put_u32(o, *max_deliveries);
            }
            Command::DeleteQueue { name } => {
                put_u8(o, DELETE_QUEUE);
                put_bytes(o, name.as_bytes());
            }
            Command::Produce {
                queue,
                producer_id,
                seq,
                messages,
            }
            | Command::ProduceUncounted {
                queue,
                producer_id,
                seq,
                messages,
            } => {
                let uncounted = matches!(self, Command::ProduceUncounted { .. });
                put_u8(
                    o,
                    if uncounted {
                        PRODUCE_UNCOUNTED
                    } else {
                        PRODUCE
                    },
                );
                put_bytes(o, queue.as_bytes());
                put_u64(o, *producer_id);
                put_u64(o, *seq);
                put_u32(o, messages.len() as u32);
                for m in messages {
                    put_bytes(o, m);
                }
            }
            Command::Consume {
                queue,
                consumer,
                max,
                visibility_ms,
                now_ms,
            } => {
                put_u8(o, CONSUME);
                put_bytes(o, queue.as_bytes());
                put_u64(o, *consumer);
                put_u32(o, *max);
                put_u64(o, *visibility_ms);
                put_u64(o, *now_ms);
            }
            Command::Ack { queue, ids } => {
                put_u8(o, ACK);
                put_bytes(o, queue.as_bytes());
                put_u32(o, ids.len() as u32);
                for id in ids {
                    put_u64(o, *id);
                }
            }
        }
        out
    }

    /// Decodes a command; `None` unless `bytes` are exactly one valid
    /// encoding within the bounds (entries are untrusted input).
    pub fn decode(bytes: &[u8]) -> Option<Command> {
        let mut r = Reader::new(bytes);
        let name = |r: &mut Reader<'_>| -> Option<String> {
            let b = r.bytes(QUEUE_NAME_BYTES_MAX)?;
            std::str::from_utf8(b).ok().map(str::to_string)
        };
        let cmd = match r.u8()? {
            CREATE_LEDGER => Command::CreateLedger {
                writer_token: r.u64()?,
                now_ms: r.u64()?,
            },
            ADD_ENTRY => Command::AddEntry {
                ledger: r.u64()?,
                writer_token: r.u64()?,
                data: r.bytes(ENTRY_BYTES_MAX)?.to_vec(),
            },
            SET_LAC => Command::SetLac {
                ledger: r.u64()?,
                writer_token: r.u64()?,
                lac: r.u64()?,
            },
            CLOSE_LEDGER => Command::CloseLedger {
                ledger: r.u64()?,
                writer_token: r.u64()?,
            },
            OPEN_RECOVER => Command::OpenRecover { ledger: r.u64()? },
            DELETE_LEDGER => Command::DeleteLedger { ledger: r.u64()? },
            CREATE_QUEUE => Command::CreateQueue {
                name: name(&mut r)?,
                max_deliveries: r.u32()?,
            },
            DELETE_QUEUE => Command::DeleteQueue {
                name: name(&mut r)?,
            },
            op @ (PRODUCE | PRODUCE_UNCOUNTED) => {
                let queue = name(&mut r)?;
                let (producer_id, seq) = (r.u64()?, r.u64()?);
                let n = r.count(PRODUCE_MESSAGES_MAX, 4)?;
                let mut messages = Vec::with_capacity(n);
                for _ in 0..n {
                    messages.push(r.bytes(MESSAGE_BYTES_MAX)?.to_vec());
                }
                if op == PRODUCE {
                    Command::Produce {
                        queue,
                        producer_id,
                        seq,
                        messages,
                    }
                } else {
                    Command::ProduceUncounted {
                        queue,
                        producer_id,
                        seq,
                        messages,
                    }
                }
            }
            CONSUME => Command::Consume {
                queue: name(&mut r)?,
                consumer: r.u64()?,
                max: r.u32()?,
                visibility_ms: r.u64()?,
                now_ms: r.u64()?,
            },
            ACK => {
                let queue = name(&mut r)?;
                let n = r.count(ACK_IDS_MAX, 8)?;
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    ids.push(r.u64()?);
                }
                Command::Ack { queue, ids }
            }
            _ => return None,
        };
        r.is_done().then_some(cmd)
    }
}

/// What a copy of a log entry must match: the entry's term and the
/// CRC32C of its whole payload (`Payload::Normal` bytes). Committed
/// entries are the same on every replica, so any replica's copy that
/// matches is the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryCheck {
    /// The term of the entry.
    pub term: u64,
    /// CRC32C of its payload.
    pub crc: u32,
}

/// Bytes of one entry check in a snapshot: index, term, crc.
const ENTRY_CHECK_BYTES: usize = 8 + 8 + 4;

/// The replicated ledgers and queues of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateMachine {
    /// Index of the last entry applied.
    applied: Index,
    /// The latest leader clock seen, in ms. Leaders' clocks differ, so
    /// after a failover `now_ms` may go back; time here never does.
    clock_ms: u64,
    ledgers: Ledgers,
    queues: Queues,
    /// The check of each entry at or above `oldest_stored` that the state
    /// referred to when it was applied (`record_check`).
    checks: imbl::OrdMap<Index, EntryCheck>,
}

impl StateMachine {
    /// An empty machine (nothing applied).
    pub fn new() -> StateMachine {
        StateMachine::default()
    }

    /// Index of the last entry applied (0 before any).
    pub fn applied_index(&self) -> Index {
        self.applied
    }

    /// The latest leader clock applied, in ms.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// The ledgers, for queries (`lac`, `read`, `list`).
    pub fn ledgers(&self) -> &Ledgers {
        &self.ledgers
    }

    /// The queues, for queries (`list`, `dead_letters`, `acked_ranges`).
    pub fn queues(&self) -> &Queues {
        &self.queues
    }

    /// Applies the command committed at `at`: the entry at an index (a
    /// `u64`), or a command's place in a command batch entry
    /// (`Stored::at(index, k, 0)`). Call in log order, once per command;
    /// a refused command changes no ledger or queue, but its index (and
    /// `now_ms`) count as applied.
    pub fn apply(&mut self, at: impl Into<Stored>, cmd: &Command) -> Result<Outcome, Error> {
        self.apply_checked(at.into(), cmd, true)
    }

    /// `apply` with produce retries matched by (producer, seq) alone, as
    /// before fingerprints: for the simulator's planted bug
    /// `DedupIgnoresProducer` only, which must still lose a produce.
    pub(crate) fn apply_without_produce_fingerprints(
        &mut self,
        at: impl Into<Stored>,
        cmd: &Command,
    ) -> Result<Outcome, Error> {
        self.apply_checked(at.into(), cmd, false)
    }

    fn apply_checked(
        &mut self,
        at: Stored,
        cmd: &Command,
        fingerprints: bool,
    ) -> Result<Outcome, Error> {
        let outcome = self.apply_unchecked(at, cmd, fingerprints);
        // Only these release references (consumes move messages between
        // live and dead, both stored); oldest_stored walks every ledger
        // and queue, so it is not asked after every command.
        if matches!(
            cmd,
            Command::Ack { .. } | Command::DeleteLedger { .. } | Command::DeleteQueue { .. }
        ) {
            self.forget_checks();
        }
        outcome
    }

    fn apply_unchecked(
        &mut self,
        at: Stored,
        cmd: &Command,
        fingerprints: bool,
    ) -> Result<Outcome, Error> {
        // The first command of an entry comes after the last entry; the
        // others of a batch share their entry's index.
        let index = at.index;
        if index < self.applied || (index == self.applied && at.command() == 0) {
            return Err(Error::AlreadyApplied);
        }
        self.applied = index;
        let now_ms = match cmd {
            Command::CreateLedger { now_ms, .. } | Command::Consume { now_ms, .. } => *now_ms,
            _ => self.clock_ms,
        };
        self.clock_ms = self.clock_ms.max(now_ms);
        let now_ms = self.clock_ms;
        let (ls, qs) = (&mut self.ledgers, &mut self.queues);
        Ok(match cmd {
            Command::CreateLedger { writer_token, .. } => {
                Outcome::LedgerCreated(ls.create(*writer_token, now_ms, at)?)
            }
            Command::AddEntry {
                ledger,
                writer_token,
                data,
            } => Outcome::EntryAdded(ls.add(*ledger, *writer_token, data.len(), at)?),
            Command::SetLac {
                ledger,
                writer_token,
                lac,
            } => Outcome::Lac(ls.set_lac(*ledger, *writer_token, *lac)?),
            Command::CloseLedger {
                ledger,
                writer_token,
            } => Outcome::Sealed(ls.close(*ledger, *writer_token)?),
            Command::OpenRecover { ledger } => Outcome::Sealed(ls.recover(*ledger)?),
            Command::DeleteLedger { ledger } => {
                ls.delete(*ledger)?;
                Outcome::Done
            }
            Command::CreateQueue {
                name,
                max_deliveries,
            } => {
                qs.create(name, *max_deliveries)?;
                Outcome::Done
            }
            Command::DeleteQueue { name } => {
                qs.delete(name)?;
                Outcome::Done
            }
            Command::Produce {
                queue,
                producer_id,
                seq,
                messages,
            }
            | Command::ProduceUncounted {
                queue,
                producer_id,
                seq,
                messages,
            } => {
                let (ids, retry) = qs.produce_checked(
                    queue,
                    (*producer_id, *seq),
                    messages,
                    matches!(cmd, Command::Produce { .. }),
                    now_ms,
                    at,
                    fingerprints,
                )?;
                Outcome::Produced { ids, retry }
            }
            Command::Consume {
                queue,
                max,
                visibility_ms,
                ..
            } => Outcome::Consumed(qs.consume(queue, *max, *visibility_ms, now_ms)?),
            Command::Ack { queue, ids } => Outcome::Acked(qs.ack(queue, ids)?),
        })
    }

    /// Records the check of the entry at `index`, just applied, whose
    /// bytes the state now refers to (its outcome added a ledger entry or
    /// produced messages). Every replica records the same: call it for
    /// exactly those outcomes.
    pub fn record_check(&mut self, index: Index, check: EntryCheck) {
        self.checks.insert(index, check);
    }

    /// `record_check` for an entry whose commands are all applied (a
    /// command batch entry): the check is kept only if the state still
    /// refers to the entry's bytes, as far as `oldest_stored` tells, since
    /// an ack or a delete after the reference in the same entry may have
    /// released it (a snapshot keeps no check below `oldest_stored`).
    pub fn record_check_after_entry(&mut self, index: Index, check: EntryCheck) {
        if self.oldest_stored().is_some_and(|o| index >= o) {
            self.checks.insert(index, check);
        }
    }

    /// This state without its entry checks (what an older snapshot
    /// restores to).
    #[cfg(test)]
    fn clone_without_checks(&self) -> StateMachine {
        StateMachine {
            checks: imbl::OrdMap::new(),
            ..self.clone()
        }
    }

    /// The check of the referenced entry at `index`, if recorded.
    pub fn check_of(&self, index: Index) -> Option<EntryCheck> {
        self.checks.get(&index).copied()
    }

    /// Drops the checks of entries below `oldest_stored`, which nothing
    /// refers to any more: after every apply, so that a state restored
    /// from a snapshot and one that applied every entry hold the same.
    fn forget_checks(&mut self) {
        let Some(oldest) = self.oldest_stored() else {
            self.checks.clear();
            return;
        };
        while let Some(&(i, _)) = self.checks.get_min() {
            if i >= oldest {
                break;
            }
            self.checks.remove(&i);
        }
    }

    /// The lowest log index whose bytes the state still needs (a ledger
    /// entry's or an unacked message's), if any: the log must keep every
    /// entry from there on, and may free whole segments below it.
    pub fn oldest_stored(&self) -> Option<Index> {
        match (self.ledgers.oldest_stored(), self.queues.oldest_stored()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Calls `f` with every log index whose bytes the state needs (in no
    /// order, possibly more than once).
    pub fn each_stored(&self, f: &mut dyn FnMut(Index)) {
        self.ledgers.each_stored(f);
        self.queues.each_stored(f);
    }

    /// The state's encoding: `SNAPSHOT_MAGIC | applied u64 | clock_ms u64 |
    /// oldest_stored u64 (plus one, 0 for none) | ledgers | queues |
    /// checks (u32 count, then index u64, term u64, crc u32 each, in
    /// index order)`. Equal states give equal bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_as(SNAPSHOT_MAGIC)
    }

    /// The snapshot in format version 7 (a run per produce at least), as
    /// a node before runs spanned commands wrote it: for the tests that it
    /// still reads.
    #[cfg(test)]
    fn snapshot_qsm7(&self) -> Vec<u8> {
        self.snapshot_as(SNAPSHOT_MAGIC_QSM7)
    }

    /// The snapshot in format version 6 (no slots), as a node before
    /// command batch entries wrote it: for the tests that it still reads.
    #[cfg(test)]
    fn snapshot_qsm6(&self) -> Vec<u8> {
        self.snapshot_as(SNAPSHOT_MAGIC_QSM6)
    }

    fn snapshot_as(&self, magic: [u8; 4]) -> Vec<u8> {
        let mut out = magic.to_vec();
        put_u64(&mut out, self.applied);
        put_u64(&mut out, self.clock_ms);
        put_u64(&mut out, self.oldest_stored().map_or(0, |i| i + 1));
        self.ledgers.encode(&mut out, magic != SNAPSHOT_MAGIC_QSM6);
        self.queues.encode(&mut out, magic == SNAPSHOT_MAGIC);
        let count = u32::try_from(self.checks.len()).expect("fewer checks than entries");
        put_u32(&mut out, count);
        for (&i, c) in &self.checks {
            put_u64(&mut out, i);
            put_u64(&mut out, c.term);
            put_u32(&mut out, c.crc);
        }
        out
    }

    /// Rebuilds a machine from `snapshot` bytes, refusing any that are not
    /// exactly one valid snapshot (they are untrusted: every count and
    /// length is bounded before anything is allocated). Integrity (a
    /// checksum) is the snapshot store's job; this checks structure.
    pub fn restore(bytes: &[u8]) -> Result<StateMachine, BadSnapshot> {
        let mut r = Reader::new(bytes);
        let version = match r.take(4) {
            Some(m) if m == SNAPSHOT_MAGIC => 8,
            Some(m) if m == SNAPSHOT_MAGIC_QSM7 => 7,
            Some(m) if m == SNAPSHOT_MAGIC_QSM6 => 6,
            Some(m) if m == SNAPSHOT_MAGIC_QSM5 => 5,
            Some(m) if m == SNAPSHOT_MAGIC_QSM4 => 4,
            Some(m) if m == SNAPSHOT_MAGIC_QSM3 => 3,
            _ => return Err(BadSnapshot),
        };
        let applied = r.u64().ok_or(BadSnapshot)?;
        let clock_ms = r.u64().ok_or(BadSnapshot)?;
        let oldest = r.u64().ok_or(BadSnapshot)?.checked_sub(1);
        let ledgers = Ledgers::decode(&mut r, version >= 7).ok_or(BadSnapshot)?;
        let queues = Queues::decode(&mut r, version).ok_or(BadSnapshot)?;
        let mut checks = imbl::OrdMap::new();
        if version >= 6 {
            let n = r.count(usize::MAX, ENTRY_CHECK_BYTES).ok_or(BadSnapshot)?;
            let mut last = None;
            for _ in 0..n {
                let i = r.u64().ok_or(BadSnapshot)?;
                let term = r.u64().ok_or(BadSnapshot)?;
                let crc = r.u32().ok_or(BadSnapshot)?;
                // In index order, each once, of entries referred to and
                // applied.
                let in_range = oldest.is_some_and(|o| i >= o) && i <= applied;
                if last.is_some_and(|l| i <= l) || !in_range {
                    return Err(BadSnapshot);
                }
                last = Some(i);
                checks.insert(i, EntryCheck { term, crc });
            }
        }
        if !r.is_done() {
            return Err(BadSnapshot);
        }
        let sm = StateMachine {
            applied,
            clock_ms,
            ledgers,
            queues,
            checks,
        };
        // Bytes are stored only by entries already applied.
        if sm.oldest_stored() != oldest || oldest.is_some_and(|i| i > applied) {
            return Err(BadSnapshot);
        }
        Ok(sm)
    }

    /// The `oldest_stored` a snapshot records, read from its header alone
    /// (`None` if the bytes are not a snapshot; `Some(None)` if the state
    /// needs no bytes from the log).
    pub fn snapshot_oldest_stored(bytes: &[u8]) -> Option<Option<Index>> {
        let mut r = Reader::new(bytes);
        let magic = r.take(4)?;
        if ![
            SNAPSHOT_MAGIC,
            SNAPSHOT_MAGIC_QSM7,
            SNAPSHOT_MAGIC_QSM6,
            SNAPSHOT_MAGIC_QSM5,
            SNAPSHOT_MAGIC_QSM4,
            SNAPSHOT_MAGIC_QSM3,
        ]
        .contains(&magic.try_into().ok()?)
        {
            return None;
        }
        r.take(16)?;
        Some(r.u64()?.checked_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Lookup, Stored};

    #[test]
    fn commands_sharing_an_entry_apply_in_slot_order_and_are_found_by_slot() {
        let mut sm = StateMachine::new();
        let q = || "q".to_string();
        sm.apply(
            1,
            &Command::CreateQueue {
                name: q(),
                max_deliveries: 5,
            },
        )
        .unwrap();
        // Entry 2 holds a create, two adds and a produce; entry 3 a produce.
        let batch = [
            Command::CreateLedger {
                writer_token: 9,
                now_ms: 0,
            },
            Command::AddEntry {
                ledger: 0,
                writer_token: 9,
                data: b"a".to_vec(),
            },
            Command::Produce {
                queue: q(),
                producer_id: 1,
                seq: 1,
                messages: vec![b"m0".to_vec(), b"m1".to_vec()],
            },
            Command::AddEntry {
                ledger: 0,
                writer_token: 9,
                data: b"b".to_vec(),
            },
        ];
        let mut entry = Vec::new();
        crate::state::query::begin_command_batch(&mut entry);
        for (k, cmd) in batch.iter().enumerate() {
            crate::state::query::push_command(&mut entry, 7, k as u64 + 1, &cmd.encode());
        }
        let outs: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(k, cmd)| sm.apply(Stored::at(2, k, 0), cmd))
            .collect();
        assert_eq!(outs[0], Ok(Outcome::LedgerCreated(0)));
        assert_eq!(outs[1], Ok(Outcome::EntryAdded(0)));
        assert_eq!(outs[3], Ok(Outcome::EntryAdded(1)));
        assert_eq!(
            sm.apply(Stored::at(2, 0, 0), &batch[1]),
            Err(Error::AlreadyApplied),
            "an entry's first command again"
        );
        assert_eq!(sm.ledgers().created_at(Stored::at(2, 0, 0)), Some(0));
        assert_eq!(sm.ledgers().entry_added_at(0, Stored::at(2, 3, 0)), Some(1));
        assert_eq!(sm.ledgers().entry_added_at(0, Stored::at(2, 2, 0)), None);
        // The bytes are found by slot: a read and a consume fill them.
        let mut payload_at = |i: u64| match i {
            2 => Lookup::Payload(entry.clone().into()),
            _ => Lookup::Missing,
        };
        // Sealed, so the last add is readable too (the LAC trails by one).
        let close = Command::CloseLedger {
            ledger: 0,
            writer_token: 9,
        };
        assert_eq!(
            sm.apply(Stored::at(2, 4, 0), &close),
            Ok(Outcome::Sealed(Some(1)))
        );
        let mut read = sm.ledgers().read(0, 0, 1).unwrap();
        crate::state::stored::fill(
            read.iter_mut().map(|e| (e.stored, &mut e.data)),
            &mut payload_at,
        )
        .unwrap();
        assert_eq!(
            read.iter().map(|e| &e.data[..]).collect::<Vec<_>>(),
            [b"a", b"b"]
        );
        let consume = Command::Consume {
            queue: q(),
            consumer: 1,
            max: 10,
            visibility_ms: 10,
            now_ms: 5,
        };
        let Ok(Outcome::Consumed(mut ds)) = sm.apply(3, &consume) else {
            panic!("a consume")
        };
        assert_eq!(ds[1].stored, Stored::at(2, 2, 1));
        crate::state::stored::fill(
            ds.iter_mut().map(|d| (d.stored, &mut d.data)),
            &mut payload_at,
        )
        .unwrap();
        assert_eq!(
            ds.iter().map(|d| &d.data[..]).collect::<Vec<_>>(),
            [b"m0", b"m1"]
        );
        // A snapshot keeps the slots; one in the format before them reads
        // as long as every command had its entry (slot 0).
        assert_eq!(StateMachine::restore(&sm.snapshot()).unwrap(), sm);
        // The format before runs spanned commands still reads.
        assert_eq!(StateMachine::restore(&sm.snapshot_qsm7()).unwrap(), sm);
        let mut single = StateMachine::new();
        single.apply(1, &batch[0]).unwrap();
        single.apply(2, &batch[1]).unwrap();
        assert_eq!(
            StateMachine::restore(&single.snapshot_qsm6()).unwrap(),
            single
        );
        assert_eq!(
            StateMachine::snapshot_oldest_stored(&single.snapshot_qsm6()),
            Some(Some(2))
        );
        assert!(
            StateMachine::restore(&sm.snapshot_qsm6()).is_err(),
            "slots past 0 in the format before them"
        );
    }

    fn every_command() -> Vec<Command> {
        let q = || "queue".to_string();
        vec![
            Command::CreateLedger {
                writer_token: 1,
                now_ms: 2,
            },
            Command::AddEntry {
                ledger: 0,
                writer_token: 1,
                data: b"entry".to_vec(),
            },
            Command::SetLac {
                ledger: 0,
                writer_token: 1,
                lac: 0,
            },
            Command::CloseLedger {
                ledger: 0,
                writer_token: 1,
            },
            Command::OpenRecover { ledger: 0 },
            Command::CreateQueue {
                name: q(),
                max_deliveries: 2,
            },
            Command::Produce {
                queue: q(),
                producer_id: 3,
                seq: 4,
                messages: vec![vec![1], vec![]],
            },
            Command::Consume {
                queue: q(),
                consumer: 5,
                max: 2,
                visibility_ms: 10,
                now_ms: 20,
            },
            Command::Ack {
                queue: q(),
                ids: vec![1],
            },
            Command::DeleteLedger { ledger: 0 },
            Command::CreateLedger {
                writer_token: 9,
                now_ms: 30,
            },
            Command::DeleteQueue { name: q() },
            Command::CreateQueue {
                name: "kept".into(),
                max_deliveries: 1,
            },
            Command::Produce {
                queue: "kept".into(),
                producer_id: 1,
                seq: 1,
                messages: vec![vec![7]],
            },
            Command::ProduceUncounted {
                queue: "kept".into(),
                producer_id: 1,
                seq: 2,
                messages: vec![vec![8]],
            },
        ]
    }

    #[test]
    fn every_command_round_trips_and_every_cut_is_refused() {
        for cmd in every_command() {
            let bytes = cmd.encode();
            assert_eq!(Command::decode(&bytes), Some(cmd.clone()));
            for cut in 0..bytes.len() {
                assert_eq!(Command::decode(&bytes[..cut]), None, "{cmd:?} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(
                Command::decode(&longer),
                None,
                "{cmd:?} with a trailing byte"
            );
        }
        assert_eq!(
            Command::decode(&[0xC1]),
            None,
            "a client entry is not a command"
        );
        // Produces are written with the tag that counts sizes; the older
        // tag still reads, as what it was.
        let produce = |tag| {
            [
                tag, 1, 0, 0, 0, b'q', 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]
        };
        assert!(matches!(
            Command::decode(&produce(PRODUCE)),
            Some(Command::Produce { .. })
        ));
        assert!(matches!(
            Command::decode(&produce(PRODUCE_UNCOUNTED)),
            Some(Command::ProduceUncounted { .. })
        ));
        let written = Command::Produce {
            queue: "q".into(),
            producer_id: 1,
            seq: 2,
            messages: vec![],
        };
        assert_eq!(written.encode(), produce(PRODUCE));
        let bad_name = [CREATE_QUEUE, 1, 0, 0, 0, 0xff, 1, 0, 0, 0];
        assert_eq!(Command::decode(&bad_name), None, "a name that is not UTF-8");
    }

    #[test]
    fn apply_answers_each_command_and_a_snapshot_restores_the_same_state() {
        let mut sm = StateMachine::new();
        let outs: Vec<_> = (1..)
            .zip(every_command())
            .map(|(index, cmd)| sm.apply(index, &cmd))
            .collect();
        let expected = vec![
            Ok(Outcome::LedgerCreated(0)),
            Ok(Outcome::EntryAdded(0)),
            Ok(Outcome::Lac(0)),
            Ok(Outcome::Sealed(Some(0))),
            Ok(Outcome::Sealed(Some(0))),
            Ok(Outcome::Done),
            Ok(Outcome::Produced {
                ids: 0..2,
                retry: false,
            }),
            Ok(Outcome::Consumed(vec![
                Delivery {
                    id: 0,
                    data: vec![],
                    deliveries: 1,
                    stored: Stored { index: 7, slot: 0 },
                },
                Delivery {
                    id: 1,
                    data: vec![],
                    deliveries: 1,
                    stored: Stored { index: 7, slot: 1 },
                },
            ])),
            Ok(Outcome::Acked(1)),
            Ok(Outcome::Done),
            Ok(Outcome::LedgerCreated(1)),
            Ok(Outcome::Done),
            Ok(Outcome::Done),
            Ok(Outcome::Produced {
                ids: 0..1,
                retry: false,
            }),
            Ok(Outcome::Produced {
                ids: 1..2,
                retry: false,
            }),
        ];
        assert_eq!(outs, expected);
        assert_eq!((sm.applied_index(), sm.clock_ms()), (15, 30));
        assert_eq!(
            sm.oldest_stored(),
            Some(14),
            "only the kept queue's message"
        );
        let bytes = sm.snapshot();
        let back = StateMachine::restore(&bytes).unwrap();
        assert_eq!(back, sm);
        assert_eq!(back.snapshot(), bytes);
        for cut in 0..bytes.len() {
            assert_eq!(
                StateMachine::restore(&bytes[..cut]),
                Err(BadSnapshot),
                "cut {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(StateMachine::restore(&longer), Err(BadSnapshot));
    }

    #[test]
    fn entry_checks_follow_the_references_and_survive_a_snapshot() {
        let check = |term| EntryCheck {
            term,
            crc: 0xdead_0000 | term as u32,
        };
        let produce = |seq| Command::Produce {
            queue: "q".into(),
            producer_id: 1,
            seq,
            messages: vec![vec![1]],
        };
        let cmds = [
            Command::CreateQueue {
                name: "q".into(),
                max_deliveries: 3,
            },
            produce(1),
            produce(2),
            Command::Consume {
                queue: "q".into(),
                consumer: 1,
                max: 1,
                visibility_ms: 10,
                now_ms: 1,
            },
        ];
        let mut sm = StateMachine::new();
        for (i, cmd) in (1..).zip(&cmds) {
            sm.apply(i, cmd).unwrap();
            if matches!(cmd, Command::Produce { .. }) {
                sm.record_check(i, check(i));
            }
        }
        assert_eq!(sm.check_of(2), Some(check(2)));
        assert_eq!(sm.check_of(3), Some(check(3)));
        // A snapshot holds them; a restored state is the same state.
        let bytes = sm.snapshot();
        assert_eq!(&bytes[..4], b"QSM8");
        let restored = StateMachine::restore(&bytes).unwrap();
        assert_eq!(restored, sm);
        assert_eq!(restored.check_of(3), Some(check(3)));
        // Acking the oldest message releases its entry, and its check.
        let ack = Command::Ack {
            queue: "q".into(),
            ids: vec![0],
        };
        let mut replayed = restored.clone();
        sm.apply(5, &ack).unwrap();
        replayed.apply(5, &ack).unwrap();
        assert_eq!(sm.check_of(2), None);
        assert_eq!(sm.check_of(3), Some(check(3)));
        assert_eq!(sm.snapshot(), replayed.snapshot());
        assert_eq!(StateMachine::restore(&sm.snapshot()).unwrap(), sm);

        // The format before checks still reads, with none (its runs are
        // format 7's).
        let mut old = sm.snapshot_qsm7();
        old.truncate(old.len() - 4 - ENTRY_CHECK_BYTES);
        old.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            StateMachine::restore(&old).unwrap(),
            sm.clone_without_checks()
        );
        old.truncate(old.len() - 4);
        old[..4].copy_from_slice(b"QSM5");
        let from_qsm5 = StateMachine::restore(&old).unwrap();
        assert_eq!(from_qsm5.check_of(3), None);
        assert_eq!(from_qsm5, sm.clone_without_checks());

        // Checks out of order, repeated, or of entries not referred to or
        // not applied are refused.
        let with_checks = |checks: &[(u64, u64)]| {
            let mut b = sm.snapshot();
            b.truncate(b.len() - 4 - ENTRY_CHECK_BYTES);
            put_u32(&mut b, checks.len() as u32);
            for &(i, term) in checks {
                put_u64(&mut b, i);
                put_u64(&mut b, term);
                put_u32(&mut b, 7);
            }
            b
        };
        assert!(StateMachine::restore(&with_checks(&[(3, 1), (4, 1)])).is_ok());
        for bad in [
            &[(4, 1), (3, 1)][..],
            &[(3, 1), (3, 1)],
            &[(2, 1)],
            &[(6, 1)],
        ] {
            assert!(
                StateMachine::restore(&with_checks(bad)).is_err(),
                "{bad:?} accepted"
            );
        }
    }
}
