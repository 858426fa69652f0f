//! Compact binary encoding of consensus [`Message`]s, for the transport's
//! payloads (our own format, not protobuf).
//!
//! Integers are LEB128 varints (terms and indexes are small most of the
//! time), byte strings are a varint length and the bytes, sets are a count
//! and strictly ascending ids. The encoding is canonical: a byte string
//! decodes only if encoding the result gives back the same bytes, so there
//! is one encoding per message and the fuzz target can check it.
//!
//! Decoding takes untrusted input: it never panics, and it checks every
//! length and count against the bytes that remain before it allocates, so
//! an allocation is never larger than a small multiple of the input.
//!
//! ```text
//! message  = version(1) from term to body          (from, to, term: varint)
//! body     = tag(1) fields...                       tags follow Body's order
//! entry    = term index payload
//! payload  = 0 (noop) | 1 bytes (normal) | 2 membership
//! membership = count id* count id*                  (voters, then learners)
//! snapshot = index term membership offset total bytes   (one chunk of the data)
//! snapshot ack = index received
//! ```

/// First byte of every message on a transport channel: a Raft message
/// (this module's encoding) follows.
pub const ENVELOPE_RAFT: u8 = 0;
/// First byte of a message on a transport channel: a heartbeat
/// (`heartbeat::Heartbeat::encode`) follows.
pub const ENVELOPE_HEARTBEAT: u8 = 1;

use super::message::{OutMessage, SHARED_PIECE_BYTES_MIN};
use super::{Endpoint, GroupId, SendError};
use crate::consensus::{
    AppendResult, Body, Entry, Index, Membership, Message, Payload, Snapshot, REPAIR_INDEXES_MAX,
};
use bytes::Bytes;
use std::collections::BTreeSet;

/// Version byte at the start of every encoded message.
pub const CODEC_VERSION: u8 = 2;
/// Most members in one set of a membership; a cluster has 3 or 5 nodes.
pub const MEMBERS_MAX: usize = 1024;
/// Most bytes an AppendEntries message carrying one entry adds to that
/// entry's payload (header, varints, the payload's length); with the
/// envelope byte it bounds the entry a transport message can carry.
pub const APPEND_OVERHEAD_BYTES_MAX: usize = 256;
/// Smallest encoding of one entry (term, index, payload tag), in bytes;
/// bounds the entry count by the input length.
const ENTRY_BYTES_MIN: usize = 3;

/// Why bytes are not a valid encoded message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodecError {
    /// The input ends inside a field.
    Truncated,
    /// Bytes follow the end of the message.
    TrailingBytes,
    /// An encoding version this build does not read.
    BadVersion(u8),
    /// An unknown tag for the named type.
    BadTag(&'static str),
    /// A varint longer than 10 bytes, overflowing 64 bits, or not minimal.
    BadVarint,
    /// A boolean byte other than 0 or 1.
    BadBool,
    /// A length or count larger than the input or the named limit.
    TooLong(&'static str),
    /// Member ids not strictly ascending (duplicates, or not canonical).
    UnsortedMembers,
    /// A repair message's indexes not strictly ascending.
    UnsortedIndexes,
}

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodecError::Truncated => write!(f, "message truncated"),
            CodecError::TrailingBytes => write!(f, "bytes after the end of the message"),
            CodecError::BadVersion(v) => {
                write!(f, "message encoding version {v}, expected {CODEC_VERSION}")
            }
            CodecError::BadTag(what) => write!(f, "unknown {what} tag"),
            CodecError::BadVarint => write!(f, "malformed varint"),
            CodecError::BadBool => write!(f, "boolean byte not 0 or 1"),
            CodecError::TooLong(what) => write!(f, "{what} longer than allowed"),
            CodecError::UnsortedMembers => write!(f, "member ids not strictly ascending"),
            CodecError::UnsortedIndexes => write!(f, "repair indexes not strictly ascending"),
        }
    }
}

impl std::error::Error for CodecError {}

/// At least the bytes `encode_message` appends for `msg`: size its
/// buffer with this, and a message of megabytes is not grown by doubling
/// (each growth a realloc that copies).
pub fn encoded_bytes_max(msg: &Message) -> usize {
    const FIXED_BYTES: usize = 64;
    FIXED_BYTES
        + match &msg.body {
            Body::Append { entries, .. } => entries_bytes_max(entries),
            Body::RepairEntries { entries, not_held } => {
                entries_bytes_max(entries) + not_held.len() * VARINT_BYTES_MAX
            }
            Body::RepairRequest { indexes } => indexes.len() * VARINT_BYTES_MAX,
            Body::InstallSnapshot { snapshot, .. } => snapshot.size_bytes() + 32,
            _ => 0,
        }
}

/// Bytes of a u64 as a varint at most.
const VARINT_BYTES_MAX: usize = 10;

/// At least the bytes `entries` encode to.
fn entries_bytes_max(entries: &[Entry]) -> usize {
    entries.iter().map(|e| e.size_bytes() + 32).sum()
}

/// Where an encoding goes: a flat buffer, or a message of pieces that
/// shares large payloads instead of copying them.
trait Sink {
    fn push(&mut self, b: u8);
    fn extend_from_slice(&mut self, b: &[u8]);
    /// Appends a payload the caller holds as shared bytes.
    fn put_shared(&mut self, b: &Bytes) {
        self.extend_from_slice(b);
    }
}

impl Sink for Vec<u8> {
    fn push(&mut self, b: u8) {
        Vec::push(self, b);
    }
    fn extend_from_slice(&mut self, b: &[u8]) {
        Vec::extend_from_slice(self, b);
    }
}

impl Sink for OutMessage {
    fn push(&mut self, b: u8) {
        self.put_u8(b);
    }
    fn extend_from_slice(&mut self, b: &[u8]) {
        self.put(b);
    }
    fn put_shared(&mut self, b: &Bytes) {
        OutMessage::put_shared(self, b);
    }
}

/// Appends the encoding of `msg` to `out`.
pub fn encode_message(msg: &Message, out: &mut Vec<u8>) {
    encode_into(msg, out);
}

/// Appends the encoding of `msg` to `out`, sharing the entries' payloads
/// of [`SHARED_PIECE_BYTES_MIN`] bytes or more rather than copying them:
/// the same bytes as [`encode_message`].
pub fn encode_message_pieces(msg: &Message, out: &mut OutMessage) {
    encode_into(msg, out);
}

/// The bytes [`encode_message_pieces`] writes into the message's own
/// buffer at most (its encoding less the payloads it shares).
pub fn own_bytes_max(msg: &Message) -> usize {
    let shared: usize = match &msg.body {
        Body::Append { entries, .. } => entries
            .iter()
            .map(|e| match &e.payload {
                Payload::Normal(d) if d.len() >= SHARED_PIECE_BYTES_MIN => d.len(),
                _ => 0,
            })
            .sum(),
        _ => 0,
    };
    encoded_bytes_max(msg).saturating_sub(shared)
}

/// Sends `msg` to `msg.to` in `group` over `ep`, encoded behind
/// [`ENVELOPE_RAFT`] into a message of pieces that shares the entries'
/// payloads with the log (one copy of each per follower, into its
/// datagram). Refused as [`Endpoint::send`] refuses.
pub fn send_raft_message(
    ep: &mut Endpoint,
    group: GroupId,
    msg: &Message,
) -> Result<std::ops::RangeInclusive<u64>, SendError> {
    let mut out = ep.out_message(msg.to, group, 1 + own_bytes_max(msg));
    out.put_u8(ENVELOPE_RAFT);
    encode_message_pieces(msg, &mut out);
    ep.send_message(msg.to, group, out)
}

fn encode_into<S: Sink>(msg: &Message, out: &mut S) {
    out.push(CODEC_VERSION);
    put_varint(out, msg.from);
    put_varint(out, msg.term);
    put_varint(out, msg.to);
    match &msg.body {
        Body::PreVote {
            last_index,
            last_term,
        } => {
            out.push(0);
            put_varint(out, *last_index);
            put_varint(out, *last_term);
        }
        Body::PreVoteResponse { granted } => {
            out.push(1);
            out.push(*granted as u8);
        }
        Body::Vote {
            last_index,
            last_term,
            transfer,
        } => {
            out.push(2);
            put_varint(out, *last_index);
            put_varint(out, *last_term);
            out.push(*transfer as u8);
        }
        Body::VoteResponse { granted } => {
            out.push(3);
            out.push(*granted as u8);
        }
        Body::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => {
            out.push(4);
            put_varint(out, *prev_index);
            put_varint(out, *prev_term);
            put_varint(out, *commit);
            put_varint(out, entries.len() as u64);
            for e in entries {
                put_entry(out, e);
            }
        }
        Body::AppendResponse(AppendResult::Accepted { match_index }) => {
            out.push(5);
            put_varint(out, *match_index);
        }
        Body::AppendResponse(AppendResult::Rejected {
            rejected_index,
            hint_index,
            hint_term,
        }) => {
            out.push(6);
            put_varint(out, *rejected_index);
            put_varint(out, *hint_index);
            put_varint(out, *hint_term);
        }
        Body::Heartbeat { commit, read_round } => {
            out.push(7);
            put_varint(out, *commit);
            put_varint(out, *read_round);
        }
        Body::HeartbeatResponse { read_round } => {
            out.push(8);
            put_varint(out, *read_round);
        }
        Body::InstallSnapshot {
            snapshot,
            offset,
            total,
        } => {
            out.push(9);
            put_varint(out, snapshot.index);
            put_varint(out, snapshot.term);
            put_membership(out, &snapshot.membership);
            put_varint(out, *offset);
            put_varint(out, *total);
            put_bytes(out, &snapshot.data);
        }
        Body::TimeoutNow => out.push(10),
        Body::SnapshotAck { index, received } => {
            out.push(11);
            put_varint(out, *index);
            put_varint(out, *received);
        }
        Body::RepairRequest { indexes } => {
            out.push(12);
            put_indexes(out, indexes);
        }
        Body::RepairEntries { entries, not_held } => {
            out.push(13);
            put_varint(out, entries.len() as u64);
            for e in entries {
                put_entry(out, e);
            }
            put_indexes(out, not_held);
        }
    }
}

/// A list of log indexes: a count, then each as a varint.
fn put_indexes<S: Sink>(out: &mut S, indexes: &[Index]) {
    put_varint(out, indexes.len() as u64);
    for &i in indexes {
        put_varint(out, i);
    }
}

/// The encoding of `msg` in a new buffer.
pub fn encode_message_to_vec(msg: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_bytes_max(msg));
    encode_message(msg, &mut out);
    out
}

/// Decodes one message that must fill `bytes` exactly. Never panics.
pub fn decode_message(bytes: &[u8]) -> Result<Message, CodecError> {
    decode_with(Reader {
        bytes,
        shared: None,
    })
}

/// `decode_message`, with the entries' payloads slices of `bytes` itself
/// rather than copies: a follower's entries then share the buffer the
/// transport reassembled the message in, from the log to the WAL's batch.
pub fn decode_message_shared(bytes: &Bytes) -> Result<Message, CodecError> {
    decode_with(Reader {
        bytes,
        shared: Some(bytes),
    })
}

/// True if `bytes` (a message as `encode_message` makes it) is an
/// AppendEntries: the one message whose payloads are worth sharing.
pub fn is_append(bytes: &[u8]) -> bool {
    let mut r = Reader {
        bytes,
        shared: None,
    };
    let header = r.u8().is_ok() && r.varint().is_ok() && r.varint().is_ok() && r.varint().is_ok();
    header && r.u8() == Ok(4)
}

/// Decodes a delivered `ENVELOPE_RAFT` message (the envelope byte
/// first). An AppendEntries is decoded shared: its entries keep the
/// buffer (one copy of each payload byte fewer on a follower). Anything
/// else is decoded by copy and the buffer handed back, for
/// `Endpoint::recycle_message`.
pub fn decode_raft_delivery(message: Vec<u8>) -> (Result<Message, CodecError>, Option<Vec<u8>>) {
    let body = message.get(1..).unwrap_or_default();
    if is_append(body) {
        let shared = Bytes::from(message).slice(1..);
        (decode_message_shared(&shared), None)
    } else {
        let decoded = decode_message(body);
        (decoded, Some(message))
    }
}

fn decode_with(mut r: Reader<'_>) -> Result<Message, CodecError> {
    let version = r.u8()?;
    if version != CODEC_VERSION {
        return Err(CodecError::BadVersion(version));
    }
    let from = r.varint()?;
    let term = r.varint()?;
    let to = r.varint()?;
    let body = match r.u8()? {
        0 => Body::PreVote {
            last_index: r.varint()?,
            last_term: r.varint()?,
        },
        1 => Body::PreVoteResponse { granted: r.bool()? },
        2 => Body::Vote {
            last_index: r.varint()?,
            last_term: r.varint()?,
            transfer: r.bool()?,
        },
        3 => Body::VoteResponse { granted: r.bool()? },
        4 => {
            let prev_index = r.varint()?;
            let prev_term = r.varint()?;
            let commit = r.varint()?;
            let count = r.count(ENTRY_BYTES_MIN, "entries")?;
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                entries.push(r.entry()?);
            }
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            }
        }
        5 => Body::AppendResponse(AppendResult::Accepted {
            match_index: r.varint()?,
        }),
        6 => Body::AppendResponse(AppendResult::Rejected {
            rejected_index: r.varint()?,
            hint_index: r.varint()?,
            hint_term: r.varint()?,
        }),
        7 => Body::Heartbeat {
            commit: r.varint()?,
            read_round: r.varint()?,
        },
        8 => Body::HeartbeatResponse {
            read_round: r.varint()?,
        },
        9 => {
            let (index, term, membership) = (r.varint()?, r.varint()?, r.membership()?);
            let (offset, total) = (r.varint()?, r.varint()?);
            Body::InstallSnapshot {
                snapshot: Snapshot {
                    index,
                    term,
                    membership,
                    data: r.bytes()?,
                },
                offset,
                total,
            }
        }
        10 => Body::TimeoutNow,
        11 => Body::SnapshotAck {
            index: r.varint()?,
            received: r.varint()?,
        },
        12 => Body::RepairRequest {
            indexes: r.indexes()?,
        },
        13 => {
            let count = r.count(ENTRY_BYTES_MIN, "entries")?;
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                entries.push(r.entry()?);
            }
            Body::RepairEntries {
                entries,
                not_held: r.indexes()?,
            }
        }
        _ => return Err(CodecError::BadTag("body")),
    };
    if !r.bytes.is_empty() {
        return Err(CodecError::TrailingBytes);
    }
    Ok(Message {
        from,
        to,
        term,
        body,
    })
}

fn put_varint<S: Sink>(out: &mut S, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes<S: Sink>(out: &mut S, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_set<S: Sink>(out: &mut S, set: &BTreeSet<u64>) {
    put_varint(out, set.len() as u64);
    for &id in set {
        put_varint(out, id);
    }
}

fn put_membership<S: Sink>(out: &mut S, m: &Membership) {
    put_set(out, &m.voters);
    put_set(out, &m.learners);
}

fn put_entry<S: Sink>(out: &mut S, e: &Entry) {
    put_varint(out, e.term);
    put_varint(out, e.index);
    match &e.payload {
        Payload::Noop => out.push(0),
        Payload::Normal(data) => {
            out.push(1);
            put_varint(out, data.len() as u64);
            out.put_shared(data);
        }
        Payload::Membership(m) => {
            out.push(2);
            put_membership(out, m);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    /// The buffer `bytes` lies in, when payloads may be slices of it.
    shared: Option<&'a Bytes>,
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, CodecError> {
        let (&b, rest) = self.bytes.split_first().ok_or(CodecError::Truncated)?;
        self.bytes = rest;
        Ok(b)
    }

    fn bool(&mut self) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CodecError::BadBool),
        }
    }

    /// LEB128, at most 10 bytes, minimal (no trailing zero groups).
    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let group = (b & 0x7f) as u64;
            if i == 9 && b > 1 {
                return Err(CodecError::BadVarint);
            }
            v |= group << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(CodecError::BadVarint);
                }
                return Ok(v);
            }
        }
        Err(CodecError::BadVarint)
    }

    /// A count of items each at least `item_bytes_min` long: it cannot
    /// exceed what the remaining input could hold.
    fn count(&mut self, item_bytes_min: usize, what: &'static str) -> Result<usize, CodecError> {
        let n = self.varint()?;
        let room = (self.bytes.len() / item_bytes_min) as u64;
        if n > room {
            return Err(CodecError::TooLong(what));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, CodecError> {
        let n = self.count(1, "byte string")?;
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head.to_vec())
    }

    /// A byte string as a payload: a slice of the shared buffer, or a copy.
    fn payload(&mut self) -> Result<Bytes, CodecError> {
        let n = self.count(1, "byte string")?;
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(match self.shared {
            Some(buf) => buf.slice_ref(head),
            None => Bytes::copy_from_slice(head),
        })
    }

    fn set(&mut self) -> Result<BTreeSet<u64>, CodecError> {
        let n = self.count(1, "member set")?;
        if n > MEMBERS_MAX {
            return Err(CodecError::TooLong("member set"));
        }
        let mut set = BTreeSet::new();
        let mut last: Option<u64> = None;
        for _ in 0..n {
            let id = self.varint()?;
            if last.is_some_and(|l| id <= l) {
                return Err(CodecError::UnsortedMembers);
            }
            last = Some(id);
            set.insert(id);
        }
        Ok(set)
    }

    /// A list of log indexes, strictly ascending, at most
    /// `REPAIR_INDEXES_MAX`.
    fn indexes(&mut self) -> Result<Vec<Index>, CodecError> {
        let n = self.count(1, "index list")?;
        if n > REPAIR_INDEXES_MAX {
            return Err(CodecError::TooLong("index list"));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let i = self.varint()?;
            if out.last().is_some_and(|&last| i <= last) {
                return Err(CodecError::UnsortedIndexes);
            }
            out.push(i);
        }
        Ok(out)
    }

    fn membership(&mut self) -> Result<Membership, CodecError> {
        Ok(Membership {
            voters: self.set()?,
            learners: self.set()?,
        })
    }

    fn entry(&mut self) -> Result<Entry, CodecError> {
        let term = self.varint()?;
        let index = self.varint()?;
        let payload = match self.u8()? {
            0 => Payload::Noop,
            1 => Payload::Normal(self.payload()?),
            2 => Payload::Membership(self.membership()?),
            _ => return Err(CodecError::BadTag("payload")),
        };
        Ok(Entry {
            term,
            index,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn big(rng: &mut ChaCha8Rng) -> u64 {
        // Mix small and full-width values so every varint length occurs.
        match rng.gen_range(0..4) {
            0 => rng.gen_range(0..128),
            1 => rng.gen_range(0..1 << 20),
            2 => rng.gen(),
            _ => u64::MAX - rng.gen_range(0..3),
        }
    }

    fn membership(rng: &mut ChaCha8Rng) -> Membership {
        Membership {
            voters: (0..rng.gen_range(0..6)).map(|_| big(rng)).collect(),
            learners: (0..rng.gen_range(0..3)).map(|_| big(rng)).collect(),
        }
    }

    fn bytes(rng: &mut ChaCha8Rng) -> Vec<u8> {
        (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect()
    }

    /// An entry's payload: one in four large enough to be shared by
    /// [`encode_message_pieces`].
    fn payload(rng: &mut ChaCha8Rng) -> Vec<u8> {
        if rng.gen_range(0..4) == 0 {
            let len = rng.gen_range(SHARED_PIECE_BYTES_MIN..3 * SHARED_PIECE_BYTES_MIN);
            (0..len).map(|_| rng.gen()).collect()
        } else {
            bytes(rng)
        }
    }

    /// A random message; every body variant and payload kind occurs.
    pub(crate) fn random_message(rng: &mut ChaCha8Rng) -> Message {
        let entries = |rng: &mut ChaCha8Rng| -> Vec<Entry> {
            (0..rng.gen_range(0..8))
                .map(|_| Entry {
                    term: big(rng),
                    index: big(rng),
                    payload: match rng.gen_range(0..3) {
                        0 => Payload::Noop,
                        1 => Payload::Normal(payload(rng).into()),
                        _ => Payload::Membership(membership(rng)),
                    },
                })
                .collect()
        };
        let indexes = |rng: &mut ChaCha8Rng| -> Vec<Index> {
            let set: BTreeSet<Index> = (0..rng.gen_range(0..20)).map(|_| big(rng)).collect();
            set.into_iter().collect()
        };
        let body = match rng.gen_range(0..14) {
            0 => Body::PreVote {
                last_index: big(rng),
                last_term: big(rng),
            },
            1 => Body::PreVoteResponse { granted: rng.gen() },
            2 => Body::Vote {
                last_index: big(rng),
                last_term: big(rng),
                transfer: rng.gen(),
            },
            3 => Body::VoteResponse { granted: rng.gen() },
            4 => Body::Append {
                prev_index: big(rng),
                prev_term: big(rng),
                commit: big(rng),
                entries: entries(rng),
            },
            5 => Body::AppendResponse(AppendResult::Accepted {
                match_index: big(rng),
            }),
            6 => Body::AppendResponse(AppendResult::Rejected {
                rejected_index: big(rng),
                hint_index: big(rng),
                hint_term: big(rng),
            }),
            7 => Body::Heartbeat {
                commit: big(rng),
                read_round: big(rng),
            },
            8 => Body::HeartbeatResponse {
                read_round: big(rng),
            },
            9 => Body::InstallSnapshot {
                snapshot: Snapshot {
                    index: big(rng),
                    term: big(rng),
                    membership: membership(rng),
                    data: bytes(rng),
                },
                offset: big(rng),
                total: big(rng),
            },
            10 => Body::SnapshotAck {
                index: big(rng),
                received: big(rng),
            },
            11 => Body::RepairRequest {
                indexes: indexes(rng),
            },
            12 => Body::RepairEntries {
                entries: entries(rng),
                not_held: indexes(rng),
            },
            _ => Body::TimeoutNow,
        };
        Message {
            from: big(rng),
            to: big(rng),
            term: big(rng),
            body,
        }
    }

    /// A message of pieces is the flat encoding's bytes, sharing (not
    /// copying) each large payload, within the own-bytes bound.
    #[test]
    fn pieces_encode_the_same_bytes_and_share_large_payloads() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut shared_seen = 0;
        for _ in 0..3_000 {
            let m = random_message(&mut rng);
            let mut pieces = OutMessage::with_buffer(Vec::new());
            encode_message_pieces(&m, &mut pieces);
            let flat = encode_message_to_vec(&m);
            assert_eq!(pieces.to_vec(), flat, "{m:?}");
            if let Body::Append { entries, .. } = &m.body {
                for e in entries {
                    let Payload::Normal(d) = &e.payload else {
                        continue;
                    };
                    if d.len() >= SHARED_PIECE_BYTES_MIN {
                        shared_seen += 1;
                        let ptr = d.as_ptr();
                        assert!(
                            pieces.slices(0..pieces.len()).any(|s| s.as_ptr() == ptr),
                            "a large payload was copied"
                        );
                    }
                }
            }
            let own = pieces.into_buffer().len();
            assert!(own <= own_bytes_max(&m), "{own} > {}", own_bytes_max(&m));
        }
        assert!(shared_seen > 40, "only {shared_seen} large payloads");
    }

    #[test]
    fn repair_index_lists_are_bounded_and_ascending() {
        let request = |indexes: Vec<Index>| Message {
            from: 1,
            to: 2,
            term: 3,
            body: Body::RepairRequest { indexes },
        };
        let most: Vec<Index> = (1..=REPAIR_INDEXES_MAX as u64).collect();
        let enc = encode_message_to_vec(&request(most.clone()));
        assert_eq!(decode_message(&enc), Ok(request(most)));
        let too_many: Vec<Index> = (1..=REPAIR_INDEXES_MAX as u64 + 1).collect();
        let enc = encode_message_to_vec(&request(too_many));
        assert_eq!(decode_message(&enc), Err(CodecError::TooLong("index list")));
        for unsorted in [vec![5, 5], vec![6, 5]] {
            let enc = encode_message_to_vec(&request(unsorted));
            assert_eq!(decode_message(&enc), Err(CodecError::UnsortedIndexes));
        }
    }

    #[test]
    fn roundtrip_every_variant() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut tags = BTreeSet::new();
        for _ in 0..5_000 {
            let m = random_message(&mut rng);
            let enc = encode_message_to_vec(&m);
            tags.insert(body_tag(&m));
            assert!(
                enc.len() <= encoded_bytes_max(&m),
                "{} > bound: {m:?}",
                enc.len()
            );
            assert_eq!(decode_message(&enc), Ok(m.clone()), "{m:?}");
            let shared = Bytes::from(enc.clone());
            assert_eq!(decode_message_shared(&shared), Ok(m.clone()), "{m:?}");
            assert_eq!(is_append(&enc), matches!(m.body, Body::Append { .. }));
        }
        assert_eq!(tags.len(), 14, "every body tag exercised");
    }

    #[test]
    fn one_entry_appends_stay_within_the_overhead_bound() {
        // Every field at its widest varint: the bound must hold for any
        // term, index and commit a leader may send.
        let payload = vec![7u8; 5_000_000];
        let m = Message {
            from: u64::MAX,
            to: u64::MAX,
            term: u64::MAX,
            body: Body::Append {
                prev_index: u64::MAX,
                prev_term: u64::MAX,
                entries: vec![Entry {
                    term: u64::MAX,
                    index: u64::MAX,
                    payload: Payload::Normal(payload.clone().into()),
                }],
                commit: u64::MAX,
            },
        };
        let enc = encode_message_to_vec(&m);
        assert!(enc.len() <= payload.len() + APPEND_OVERHEAD_BYTES_MAX);
        assert!(
            enc.len() > payload.len() + APPEND_OVERHEAD_BYTES_MAX / 4,
            "bound not loose"
        );
    }

    fn body_tag(m: &Message) -> usize {
        match &m.body {
            Body::PreVote { .. } => 0,
            Body::PreVoteResponse { .. } => 1,
            Body::Vote { .. } => 2,
            Body::VoteResponse { .. } => 3,
            Body::Append { .. } => 4,
            Body::AppendResponse(AppendResult::Accepted { .. }) => 5,
            Body::AppendResponse(AppendResult::Rejected { .. }) => 6,
            Body::Heartbeat { .. } => 7,
            Body::HeartbeatResponse { .. } => 8,
            Body::InstallSnapshot { .. } => 9,
            Body::TimeoutNow => 10,
            Body::SnapshotAck { .. } => 11,
            Body::RepairRequest { .. } => 12,
            Body::RepairEntries { .. } => 13,
        }
    }

    #[test]
    fn shared_decoding_points_into_the_message_and_refuses_what_copying_refuses() {
        let m = Message {
            from: 1,
            to: 2,
            term: 3,
            body: Body::Append {
                prev_index: 4,
                prev_term: 3,
                entries: vec![Entry {
                    term: 3,
                    index: 5,
                    payload: Payload::Normal(vec![9u8; 1000].into()),
                }],
                commit: 4,
            },
        };
        let shared = Bytes::from(encode_message_to_vec(&m));
        let span = shared.as_ptr_range();
        let Body::Append { entries, .. } = decode_message_shared(&shared).unwrap().body else {
            panic!("an append");
        };
        let Payload::Normal(data) = &entries[0].payload else {
            panic!("a normal entry");
        };
        assert!(span.contains(&data.as_ptr()), "not a copy");
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            let enc = encode_message_to_vec(&random_message(&mut rng));
            for len in 0..enc.len() {
                let cut = Bytes::copy_from_slice(&enc[..len]);
                assert_eq!(decode_message_shared(&cut), decode_message(&cut));
                assert!(decode_message_shared(&cut).is_err());
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..300 {
            let enc = encode_message_to_vec(&random_message(&mut rng));
            for len in 0..enc.len() {
                assert!(decode_message(&enc[..len]).is_err());
            }
            let mut long = enc.clone();
            long.push(0);
            assert_eq!(decode_message(&long), Err(CodecError::TrailingBytes));
        }
    }

    #[test]
    fn varints_are_canonical() {
        let mut r = Reader {
            bytes: &[0x80, 0x00],
            shared: None,
        };
        assert_eq!(r.varint(), Err(CodecError::BadVarint), "overlong zero");
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(
            Reader {
                bytes: &max,
                shared: None
            }
            .varint(),
            Ok(u64::MAX)
        );
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(
            Reader {
                bytes: &over,
                shared: None
            }
            .varint(),
            Err(CodecError::BadVarint)
        );
        let eleven = [0x80; 11];
        assert_eq!(
            Reader {
                bytes: &eleven,
                shared: None
            }
            .varint(),
            Err(CodecError::BadVarint)
        );
    }

    #[test]
    fn lengths_are_bounded_before_allocating() {
        // An append claiming 2^62 entries in a 12-byte message.
        let mut b = vec![CODEC_VERSION, 1, 1, 2, 4, 0, 0, 0];
        put_varint(&mut b, 1 << 62);
        assert_eq!(decode_message(&b), Err(CodecError::TooLong("entries")));
        // A snapshot whose data claims 1 GiB.
        let mut b = vec![CODEC_VERSION, 1, 1, 2, 9, 0, 0, 0, 0, 0, 0];
        put_varint(&mut b, 1 << 30);
        assert_eq!(decode_message(&b), Err(CodecError::TooLong("byte string")));
        // Duplicate voters are not canonical.
        let b = vec![CODEC_VERSION, 1, 1, 2, 9, 0, 0, 2, 5, 5, 0, 0];
        assert_eq!(decode_message(&b), Err(CodecError::UnsortedMembers));
    }

    /// Random bytes never panic, and whatever decodes re-encodes to the
    /// same bytes.
    #[test]
    fn random_bytes_never_panic_and_decodes_are_canonical() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut ok = 0;
        for i in 0..50_000 {
            let len = rng.gen_range(0..64);
            let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if i % 2 == 0 && !b.is_empty() {
                b[0] = CODEC_VERSION;
                if b.len() > 4 {
                    b[4] = rng.gen_range(0..14);
                }
            }
            if let Ok(m) = decode_message(&b) {
                ok += 1;
                assert_eq!(encode_message_to_vec(&m), b);
            }
        }
        assert!(ok > 0, "some random inputs should decode");
    }
}
