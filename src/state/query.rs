//! What a client asks of the state machine without changing it (queries),
//! what it gets back (answers, and the outcome of an applied command), and
//! the byte encodings of all three, plus the envelope that carries a
//! command in a log entry.
//!
//! The client protocol (api/wire.rs) carries these encodings as opaque
//! bytes: the state machine owns its vocabulary, the frame format does not
//! change when a command is added. Every decoder takes untrusted bytes and
//! is total: it refuses (None) anything `encode` could not have written.

use super::ledger::{
    LedgerEntry, LedgerInfo, LedgerState, ENTRY_BYTES_MAX, LEDGERS_MAX, READ_ENTRIES_MAX,
};
use super::machine::{Error, Outcome, StateMachine};
use super::queue::{Delivery, QueueInfo, CONSUME_MAX, MESSAGE_BYTES_MAX, QUEUES_MAX};
use super::stored::{fill, Lookup, Stored, Unfilled};
use super::wire::{put_bytes, put_u32, put_u64, put_u8, Reader};

/// First byte of a log entry that carries a state-machine command.
pub const COMMAND_ENTRY: u8 = 0xC2;
/// Bytes before the command in such an entry: tag, client id, seq.
pub const COMMAND_HEADER_BYTES: usize = 17;

/// A log entry carrying `command` (a `Command::encode`), proposed by
/// `client_id` as its `seq`-th request; `client_id` 0 means the command
/// needs no deduplication (it is idempotent by itself, as a produce is).
pub fn encode_command_entry(client_id: u64, seq: u64, command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(COMMAND_HEADER_BYTES + command.len());
    out.push(COMMAND_ENTRY);
    out.extend_from_slice(&client_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(command);
    out
}

/// Splits a command entry into (client id, seq, command bytes); `None`
/// for any other payload.
pub fn decode_command_entry(payload: &[u8]) -> Option<(u64, u64, &[u8])> {
    if payload.len() < COMMAND_HEADER_BYTES || payload[0] != COMMAND_ENTRY {
        return None;
    }
    let client = u64::from_le_bytes(payload[1..9].try_into().ok()?);
    let seq = u64::from_le_bytes(payload[9..17].try_into().ok()?);
    Some((client, seq, &payload[COMMAND_HEADER_BYTES..]))
}

/// The command in a single-command entry, whoever proposed it; `None`
/// for any other payload (a command batch entry too: see [`command_at`])
/// or a command that does not decode.
pub fn decode_command(payload: &[u8]) -> Option<super::Command> {
    decode_command_entry(payload).and_then(|(_, _, bytes)| super::Command::decode(bytes))
}

/// First byte of a command batch entry: the ledger and queue commands a
/// leader gathered in one turn, one Raft entry (one waiter, one CRC, one
/// fsync share) for all of them, applied in slot order as if each were
/// an entry of its own. The layout of a client batch entry:
/// `0xC4 | count u32 LE | count × (client_id u64 | seq u64 | len u32 | command)`.
pub const COMMAND_BATCH_ENTRY: u8 = 0xC4;
/// Commands one entry holds at most: a command's position in its entry
/// takes the high bits of a [`super::Stored`] slot and the low bits of a
/// dedup address, so it stays well inside both.
pub const COMMANDS_PER_ENTRY_MAX: usize = 8192;
/// Bytes before each command in a command batch entry.
pub const COMMAND_RECORD_HEADER_BYTES: usize = crate::state::dedup::CLIENT_RECORD_HEADER_BYTES;
/// Header bytes of a command batch entry (the tag and the count).
pub const COMMAND_BATCH_HEADER_BYTES: usize = crate::state::dedup::CLIENT_BATCH_HEADER_BYTES;
const _: () = assert!(COMMANDS_PER_ENTRY_MAX <= crate::state::dedup::RECORDS_PER_ENTRY_MAX);
const _: () = assert!(COMMANDS_PER_ENTRY_MAX <= 1 << (32 - super::stored::COMMAND_SLOT_BITS));

/// Starts a command batch entry in `out` (cleared first).
pub fn begin_command_batch(out: &mut Vec<u8>) {
    crate::state::dedup::begin_client_batch(out);
    out[0] = COMMAND_BATCH_ENTRY;
}

/// Appends `command` (a `Command::encode`), client `client_id`'s request
/// `seq`, to the command batch entry begun in `out` (laid out as a
/// client batch entry's record).
pub fn push_command(out: &mut Vec<u8>, client_id: u64, seq: u64, command: &[u8]) {
    crate::state::dedup::push_client_record(out, client_id, seq, command);
}

/// The commands of a command entry (one) or of a command batch entry, in
/// slot order, as (client id, seq, command bytes); `None` for any other
/// payload. A batch cut short yields the commands that decode whole,
/// alike on every replica.
pub fn command_records(payload: &[u8]) -> Option<crate::state::dedup::ClientRecords<'_>> {
    use crate::state::dedup::ClientRecords;
    match payload.first() {
        Some(&COMMAND_ENTRY) => decode_command_entry(payload).map(ClientRecords::one),
        Some(&COMMAND_BATCH_ENTRY) => ClientRecords::batch(payload, COMMANDS_PER_ENTRY_MAX),
        _ => None,
    }
}

/// The command at position `slot` of a command entry or command batch
/// entry; `None` if there is none or it does not decode.
pub fn command_at(payload: &[u8], slot: usize) -> Option<super::Command> {
    let (_, _, bytes) = command_records(payload)?.nth(slot)?;
    super::Command::decode(bytes)
}

/// Every command of a command entry or command batch entry that decodes,
/// in slot order (empty for any other payload).
pub fn decode_commands(payload: &[u8]) -> Vec<super::Command> {
    command_records(payload)
        .into_iter()
        .flatten()
        .filter_map(|(_, _, bytes)| super::Command::decode(bytes))
        .collect()
}

/// A read-only question to one group's state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    /// One ledger's metadata: opening without recovery, or its LAC.
    Ledger {
        /// The ledger's id.
        ledger: u64,
    },
    /// Entries `from..=to` of a ledger, cut at its LAC.
    ReadLedger {
        /// The ledger's id.
        ledger: u64,
        /// First entry id wanted.
        from: u64,
        /// Last entry id wanted.
        to: u64,
    },
    /// Every ledger's metadata.
    ListLedgers,
    /// Every queue's metadata.
    ListQueues,
    /// A queue's dead-lettered messages.
    DeadLetters {
        /// The queue's name.
        queue: String,
    },
}

/// The answer to a [`Query`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// One ledger's metadata.
    Ledger(LedgerInfo),
    /// Ledger entries, in order.
    Entries(Vec<LedgerEntry>),
    /// Ledgers' metadata.
    Ledgers(Vec<LedgerInfo>),
    /// Queues' metadata.
    Queues(Vec<QueueInfo>),
    /// Messages (dead letters).
    Deliveries(Vec<Delivery>),
}

const Q_LEDGER: u8 = 1;
const Q_READ_LEDGER: u8 = 2;
const Q_LIST_LEDGERS: u8 = 3;
const Q_LIST_QUEUES: u8 = 4;
const Q_DEAD_LETTERS: u8 = 5;

/// Items in one answer list at most (a dead-letter list is cut here, or
/// at `CONSUME_BYTES_MAX` of messages).
pub const ANSWER_ITEMS_MAX: usize = 1 << 16;

impl Query {
    /// Its encoding: a tag byte, then the fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Query::Ledger { ledger } => {
                put_u8(&mut out, Q_LEDGER);
                put_u64(&mut out, *ledger);
            }
            Query::ReadLedger { ledger, from, to } => {
                put_u8(&mut out, Q_READ_LEDGER);
                put_u64(&mut out, *ledger);
                put_u64(&mut out, *from);
                put_u64(&mut out, *to);
            }
            Query::ListLedgers => put_u8(&mut out, Q_LIST_LEDGERS),
            Query::ListQueues => put_u8(&mut out, Q_LIST_QUEUES),
            Query::DeadLetters { queue } => {
                put_u8(&mut out, Q_DEAD_LETTERS);
                put_bytes(&mut out, queue.as_bytes());
            }
        }
        out
    }

    /// Decodes untrusted bytes: exactly one query, or `None`.
    pub fn decode(bytes: &[u8]) -> Option<Query> {
        let mut r = Reader::new(bytes);
        let q = match r.u8()? {
            Q_LEDGER => Query::Ledger { ledger: r.u64()? },
            Q_READ_LEDGER => Query::ReadLedger {
                ledger: r.u64()?,
                from: r.u64()?,
                to: r.u64()?,
            },
            Q_LIST_LEDGERS => Query::ListLedgers,
            Q_LIST_QUEUES => Query::ListQueues,
            Q_DEAD_LETTERS => Query::DeadLetters {
                queue: std::str::from_utf8(r.bytes(super::queue::QUEUE_NAME_BYTES_MAX)?)
                    .ok()?
                    .to_string(),
            },
            _ => return None,
        };
        r.is_done().then_some(q)
    }
}

impl StateMachine {
    /// Answers a query from the applied state.
    pub fn query(&self, q: &Query) -> Result<Answer, Error> {
        Ok(match q {
            Query::Ledger { ledger } => Answer::Ledger(self.ledgers().info(*ledger)?),
            Query::ReadLedger { ledger, from, to } => {
                Answer::Entries(self.ledgers().read(*ledger, *from, *to)?)
            }
            Query::ListLedgers => Answer::Ledgers(self.ledgers().list()),
            Query::ListQueues => Answer::Queues(self.queues().list()),
            Query::DeadLetters { queue } => {
                Answer::Deliveries(self.queues().dead_letters(queue, ANSWER_ITEMS_MAX)?)
            }
        })
    }
}

fn put_ledger_info(out: &mut Vec<u8>, l: &LedgerInfo) {
    put_u64(out, l.id);
    let state = match l.state {
        LedgerState::Open => 0,
        LedgerState::Closed => 1,
    };
    put_u8(out, state | u8::from(l.fenced) << 1);
    put_u64(out, l.length);
    put_u64(out, l.bytes);
    put_u64(out, l.lac.map_or(0, |v| v + 1));
    put_u64(out, l.created_ms);
}

fn get_ledger_info(r: &mut Reader<'_>) -> Option<LedgerInfo> {
    let id = r.u64()?;
    let flags = r.u8()?;
    if flags > 3 {
        return None;
    }
    let state = if flags & 1 == 1 {
        LedgerState::Closed
    } else {
        LedgerState::Open
    };
    Some(LedgerInfo {
        id,
        state,
        fenced: flags & 2 != 0,
        length: r.u64()?,
        bytes: r.u64()?,
        lac: r.u64()?.checked_sub(1),
        created_ms: r.u64()?,
    })
}

fn put_deliveries(out: &mut Vec<u8>, ds: &[Delivery]) {
    put_u32(out, ds.len() as u32);
    for d in ds {
        put_u64(out, d.id);
        put_u32(out, d.deliveries);
        put_bytes(out, &d.data);
    }
}

fn get_deliveries(r: &mut Reader<'_>, max: usize) -> Option<Vec<Delivery>> {
    let n = r.count(max, 8 + 4 + 4)?;
    (0..n)
        .map(|_| {
            Some(Delivery {
                id: r.u64()?,
                deliveries: r.u32()?,
                data: r.bytes(MESSAGE_BYTES_MAX)?.to_vec(),
                stored: Stored::default(),
            })
        })
        .collect()
}

const A_LEDGER: u8 = 1;
const A_ENTRIES: u8 = 2;
const A_LEDGERS: u8 = 3;
const A_QUEUES: u8 = 4;
const A_DELIVERIES: u8 = 5;

impl Answer {
    /// Its encoding: a tag byte, then the fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let o = &mut out;
        match self {
            Answer::Ledger(l) => {
                put_u8(o, A_LEDGER);
                put_ledger_info(o, l);
            }
            Answer::Entries(es) => {
                put_u8(o, A_ENTRIES);
                put_u32(o, es.len() as u32);
                for e in es {
                    put_u64(o, e.id);
                    put_bytes(o, &e.data);
                }
            }
            Answer::Ledgers(ls) => {
                put_u8(o, A_LEDGERS);
                put_u32(o, ls.len() as u32);
                for l in ls {
                    put_ledger_info(o, l);
                }
            }
            Answer::Queues(qs) => {
                put_u8(o, A_QUEUES);
                put_u32(o, qs.len() as u32);
                for q in qs {
                    put_bytes(o, q.name.as_bytes());
                    put_u32(o, q.max_deliveries);
                    put_u64(o, q.produced);
                    put_u64(o, q.unacked);
                    put_u64(o, q.dead);
                }
            }
            Answer::Deliveries(ds) => {
                put_u8(o, A_DELIVERIES);
                put_deliveries(o, ds);
            }
        }
        out
    }

    /// Decodes untrusted bytes: exactly one answer, or `None`.
    pub fn decode(bytes: &[u8]) -> Option<Answer> {
        let mut r = Reader::new(bytes);
        let a = match r.u8()? {
            A_LEDGER => Answer::Ledger(get_ledger_info(&mut r)?),
            A_ENTRIES => {
                let n = r.count(READ_ENTRIES_MAX, 8 + 4)?;
                let mut es = Vec::with_capacity(n);
                for _ in 0..n {
                    es.push(LedgerEntry {
                        id: r.u64()?,
                        data: r.bytes(ENTRY_BYTES_MAX)?.to_vec(),
                        stored: Stored::default(),
                    });
                }
                Answer::Entries(es)
            }
            A_LEDGERS => {
                let n = r.count(LEDGERS_MAX, 8 + 1 + 32)?;
                Answer::Ledgers(
                    (0..n)
                        .map(|_| get_ledger_info(&mut r))
                        .collect::<Option<_>>()?,
                )
            }
            A_QUEUES => {
                let n = r.count(QUEUES_MAX, 4 + 4 + 24)?;
                let mut qs = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = std::str::from_utf8(r.bytes(super::queue::QUEUE_NAME_BYTES_MAX)?)
                        .ok()?
                        .to_string();
                    qs.push(QueueInfo {
                        name,
                        max_deliveries: r.u32()?,
                        produced: r.u64()?,
                        unacked: r.u64()?,
                        dead: r.u64()?,
                    });
                }
                Answer::Queues(qs)
            }
            A_DELIVERIES => Answer::Deliveries(get_deliveries(&mut r, ANSWER_ITEMS_MAX)?),
            _ => return None,
        };
        r.is_done().then_some(a)
    }
}

const O_LEDGER_CREATED: u8 = 1;
const O_ENTRY_ADDED: u8 = 2;
const O_LAC: u8 = 3;
const O_SEALED: u8 = 4;
const O_DONE: u8 = 5;
const O_PRODUCED: u8 = 6;
const O_CONSUMED: u8 = 7;
const O_ACKED: u8 = 8;

impl Outcome {
    /// Its encoding: a tag byte, then the fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let o = &mut out;
        match self {
            Outcome::LedgerCreated(id) => {
                put_u8(o, O_LEDGER_CREATED);
                put_u64(o, *id);
            }
            Outcome::EntryAdded(id) => {
                put_u8(o, O_ENTRY_ADDED);
                put_u64(o, *id);
            }
            Outcome::Lac(lac) => {
                put_u8(o, O_LAC);
                put_u64(o, *lac);
            }
            Outcome::Sealed(last) => {
                put_u8(o, O_SEALED);
                put_u64(o, last.map_or(0, |v| v + 1));
            }
            Outcome::Done => put_u8(o, O_DONE),
            Outcome::Produced { ids, retry } => {
                put_u8(o, O_PRODUCED);
                put_u64(o, ids.start);
                put_u64(o, ids.end);
                put_u8(o, u8::from(*retry));
            }
            Outcome::Consumed(ds) => {
                put_u8(o, O_CONSUMED);
                put_deliveries(o, ds);
            }
            Outcome::Acked(n) => {
                put_u8(o, O_ACKED);
                put_u64(o, *n);
            }
        }
        out
    }

    /// Decodes untrusted bytes: exactly one outcome, or `None`.
    pub fn decode(bytes: &[u8]) -> Option<Outcome> {
        let mut r = Reader::new(bytes);
        let o = match r.u8()? {
            O_LEDGER_CREATED => Outcome::LedgerCreated(r.u64()?),
            O_ENTRY_ADDED => Outcome::EntryAdded(r.u64()?),
            O_LAC => Outcome::Lac(r.u64()?),
            O_SEALED => Outcome::Sealed(r.u64()?.checked_sub(1)),
            O_DONE => Outcome::Done,
            O_PRODUCED => {
                let (start, end) = (r.u64()?, r.u64()?);
                let retry = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                if end < start {
                    return None;
                }
                Outcome::Produced {
                    ids: start..end,
                    retry,
                }
            }
            O_CONSUMED => Outcome::Consumed(get_deliveries(&mut r, CONSUME_MAX as usize)?),
            O_ACKED => Outcome::Acked(r.u64()?),
            _ => return None,
        };
        r.is_done().then_some(o)
    }
}

impl Answer {
    /// Fills in the bytes of the entries or messages it carries from the
    /// log (`payload_at`: looks up the payload of the log entry at an
    /// index), as [`stored::fill`](super::stored::fill) does.
    pub fn fill(&mut self, payload_at: &mut dyn FnMut(u64) -> Lookup) -> Result<(), Unfilled> {
        match self {
            Answer::Entries(es) => fill(es.iter_mut().map(|e| (e.stored, &mut e.data)), payload_at),
            Answer::Deliveries(ds) => {
                fill(ds.iter_mut().map(|d| (d.stored, &mut d.data)), payload_at)
            }
            _ => Ok(()),
        }
    }
}

impl Outcome {
    /// Fills in the bytes of the messages a consume hands out, as
    /// [`Answer::fill`] does.
    pub fn fill(&mut self, payload_at: &mut dyn FnMut(u64) -> Lookup) -> Result<(), Unfilled> {
        match self {
            Outcome::Consumed(ds) => {
                fill(ds.iter_mut().map(|d| (d.stored, &mut d.data)), payload_at)
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoSuchLedger => f.write_str("no such ledger"),
            Error::NotWriter => f.write_str("not the ledger's writer (wrong token)"),
            Error::Fenced => f.write_str("fenced: the ledger was opened with recovery"),
            Error::Closed => f.write_str("the ledger is closed"),
            Error::LacBeyondEnd => f.write_str("LAC beyond the last entry added"),
            Error::NoSuchQueue => f.write_str("no such queue"),
            Error::QueueExists => f.write_str("a queue with that name exists"),
            Error::Forgotten => f.write_str(
                "produce sequence older than the producer's window (it may have been applied)",
            ),
            Error::Conflict => f.write_str(
                "conflict: this producer id and seq were already used for other messages; nothing was added",
            ),
            Error::Limit(what) => write!(f, "limit exceeded: {what}"),
            Error::Invalid => f.write_str("invalid argument"),
            Error::AlreadyApplied => f.write_str("index already applied"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codecs_round_trip_and_refuse_every_cut() {
        let info = LedgerInfo {
            id: 3,
            state: LedgerState::Closed,
            fenced: true,
            length: 5,
            bytes: 77,
            lac: Some(4),
            created_ms: 9,
        };
        let d = Delivery {
            id: 8,
            data: b"m".to_vec(),
            deliveries: 2,
            stored: Stored::default(),
        };
        let entry = |id, data: &[u8]| LedgerEntry {
            id,
            data: data.to_vec(),
            stored: Stored::default(),
        };
        let answers = [
            Answer::Ledger(info.clone()),
            Answer::Entries(vec![entry(0, b"a"), entry(1, b"")]),
            Answer::Ledgers(vec![info.clone(), LedgerInfo { lac: None, ..info }]),
            Answer::Queues(vec![QueueInfo {
                name: "q".into(),
                max_deliveries: 3,
                produced: 10,
                unacked: 2,
                dead: 1,
            }]),
            Answer::Deliveries(vec![d.clone()]),
        ];
        for a in answers {
            let b = a.encode();
            assert_eq!(Answer::decode(&b), Some(a.clone()));
            for cut in 0..b.len() {
                assert_eq!(Answer::decode(&b[..cut]), None, "{a:?} cut at {cut}");
            }
        }
        let outcomes = [
            Outcome::LedgerCreated(1),
            Outcome::EntryAdded(2),
            Outcome::Lac(3),
            Outcome::Sealed(None),
            Outcome::Sealed(Some(0)),
            Outcome::Done,
            Outcome::Produced {
                ids: 4..9,
                retry: true,
            },
            Outcome::Consumed(vec![d]),
            Outcome::Acked(7),
        ];
        for o in outcomes {
            let b = o.encode();
            assert_eq!(Outcome::decode(&b), Some(o.clone()));
            for cut in 0..b.len() {
                assert_eq!(Outcome::decode(&b[..cut]), None, "{o:?} cut at {cut}");
            }
        }
        let queries = [
            Query::Ledger { ledger: 1 },
            Query::ReadLedger {
                ledger: 1,
                from: 2,
                to: 3,
            },
            Query::ListLedgers,
            Query::ListQueues,
            Query::DeadLetters { queue: "q".into() },
        ];
        for q in queries {
            let b = q.encode();
            assert_eq!(Query::decode(&b), Some(q.clone()));
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Query::decode(&long), None, "trailing bytes");
        }
        let e = encode_command_entry(5, 6, b"cmd");
        assert_eq!(decode_command_entry(&e), Some((5, 6, &b"cmd"[..])));
        assert_eq!(decode_command_entry(&e[..16]), None);
    }
}
