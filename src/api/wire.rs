//! The client frame format: requests, responses and error codes as bytes.
//!
//! This file owns the bytes on the wire and nothing else: no state, no
//! I/O. Decoding takes untrusted input and is total: any byte string
//! either decodes or yields a typed [`DecodeError`]; it never panics,
//! never allocates in proportion to a length it has not checked against
//! the bytes actually present, and accepts nothing it would not itself
//! have written (decode then encode gives back the same bytes), with one
//! exception kept for older clients: a Read or Tail without its trailing
//! `stale` byte, the form of version 1 before that byte was added, decodes
//! as not stale (and re-encodes with the byte, 0).
//!
//! ```text
//! frame = len u32 | version u8 | opcode u8 | id u64 | payload     (integers little-endian)
//!   len      bytes after the length field: 10 + payload; the whole frame
//!            (4 + len) is at most frame_bytes_max (default FRAME_BYTES_MAX)
//!   version  VERSION (1); the length and version fields never move, so a
//!            peer of any version can always be told UnsupportedVersion
//!   id       chosen by the client, echoed in the response; 0 is never a
//!            request id (an Error with id 0 is about the connection)
//!
//! bytes  = n u32 | n bytes          string = bytes, valid UTF-8
//! list   = count u32 | count items  (count <= ITEMS_MAX)
//!
//! requests                                  responses
//!  0x01 Hello     version u8 | token bytes   0x81 HelloOk       node u64
//!  0x02 Append    group u32 | client_id u64  0x82 Appended      index u64
//!                 | seq u64 | data bytes
//!  0x03 AppendBatch group u32 | client_id u64 0x83 AppendedBatch first_index u64 | count u32
//!                 | first_seq u64 | list(bytes)
//!  0x04 Read      group u32 | from u64       0x84 Entries       list(index u64 | term u64 | data bytes)
//!                 | max_entries u32 | max_bytes u32 | stale u8
//!  0x05 Tail      group u32 | from u64 | wait_ms u32 | stale u8  (answered with Entries)
//!            stale  0: linearizable, served by the leader after a read-index
//!                   round (a follower answers NotLeader); 1: served by this
//!                   node from what it has applied (may lag); nothing else;
//!                   absent (a client from before the byte): 0
//!  0x06 Leaders   (empty)                    0x86 LeaderMap     list(group u32 | leader u64 | addr string)
//!  0x07 Status    (empty)                    0x87 StatusJson    json string
//!  0x08 Command   group u32 | client_id u64  0x88 Outcome       outcome bytes
//!                 | seq u64 | command bytes
//!  0x09 Query     group u32 | wait_ms u32    0x89 Answer        answer bytes
//!                 | query bytes
//!                                            0xFF Error         code u16 | message string
//!                                                               | 0 u8, or 1 u8 | leader u64 | addr string
//! ```

use bytes::Bytes;
use std::fmt;

use crate::consensus::NodeId;
use crate::transport::GroupId;

/// Protocol version this build speaks; frames of another version are rejected.
pub const VERSION: u8 = 1;
/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;
/// Bytes after the length prefix and before the payload: version, opcode, id.
pub const HEADER_BYTES: usize = 10;
/// Smallest frame: a length prefix and a header with an empty payload.
pub const FRAME_BYTES_MIN: usize = LEN_BYTES + HEADER_BYTES;
/// Default largest frame, prefix included (16 MiB); configurable per session.
pub const FRAME_BYTES_MAX: usize = 16 << 20;
/// Largest `frame_bytes_max` a session accepts: what a u32 length can say.
pub const FRAME_BYTES_LIMIT: usize = LEN_BYTES + u32::MAX as usize;
/// Most items in one list (batch items, entries, leader map rows). Bounds
/// the memory of a decoded message to its frame plus 64 bytes per item.
pub const ITEMS_MAX: usize = 1 << 16;
/// Largest auth token in a Hello.
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Largest Hello frame: until a Hello succeeds, a server buffers no more.
pub const HELLO_FRAME_BYTES_MAX: usize = FRAME_BYTES_MIN + 1 + 4 + TOKEN_BYTES_MAX;

/// Opcode of [`Request::Command`].
pub const OP_COMMAND: u8 = 0x08;
/// Opcode of [`Request::Query`].
pub const OP_QUERY: u8 = 0x09;
/// Opcode of [`Response::Outcome`].
pub const OP_OUTCOME: u8 = 0x88;
/// Opcode of [`Response::Answer`].
pub const OP_ANSWER: u8 = 0x89;
/// Opcode of [`Request::Hello`].
pub const OP_HELLO: u8 = 0x01;
/// Opcode of [`Request::Append`].
pub const OP_APPEND: u8 = 0x02;
/// Opcode of [`Request::AppendBatch`].
pub const OP_APPEND_BATCH: u8 = 0x03;
/// Opcode of [`Request::Read`].
pub const OP_READ: u8 = 0x04;
/// Opcode of [`Request::Tail`].
pub const OP_TAIL: u8 = 0x05;
/// Opcode of [`Request::Leaders`].
pub const OP_LEADERS: u8 = 0x06;
/// Opcode of [`Request::Status`].
pub const OP_STATUS: u8 = 0x07;
/// Opcode of [`Response::HelloOk`].
pub const OP_HELLO_OK: u8 = 0x81;
/// Opcode of [`Response::Appended`].
pub const OP_APPENDED: u8 = 0x82;
/// Opcode of [`Response::AppendedBatch`].
pub const OP_APPENDED_BATCH: u8 = 0x83;
/// Opcode of [`Response::Entries`].
pub const OP_ENTRIES: u8 = 0x84;
/// Opcode of [`Response::LeaderMap`].
pub const OP_LEADER_MAP: u8 = 0x86;
/// Opcode of [`Response::StatusJson`].
pub const OP_STATUS_JSON: u8 = 0x87;
/// Opcode of [`Response::Error`].
pub const OP_ERROR: u8 = 0xFF;

/// Why a request failed; the u16 of each code is stable on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// This node does not lead the group; the error names the leader if known.
    NotLeader = 1,
    /// The ledger was fenced by a newer opener (reserved for ledgers).
    Fenced = 2,
    /// The request or its response exceeds a size limit.
    TooLarge = 3,
    /// The disk of the group is full; nothing confirmed was lost.
    DiskFull = 4,
    /// The group cannot serve now (no quorum, stopped disk); retry later.
    Unavailable = 5,
    /// The request is malformed or makes no sense.
    BadRequest = 6,
    /// No valid Hello: missing, or the token is wrong.
    Unauthorized = 7,
    /// The frame or Hello names a protocol version this node does not speak.
    UnsupportedVersion = 8,
    /// No such group in this cluster.
    UnknownGroup = 9,
    /// Timed out; the outcome is unknown (an append may still commit).
    Timeout = 10,
    /// A bug or an unexpected condition on the node.
    Internal = 11,
    /// No such ledger or queue.
    NotFound = 12,
    /// The ledger or queue is not in a state that allows it (closed, not
    /// the writer, exists already, a forgotten produce sequence...).
    Conflict = 13,
    /// The connection's principal may not do this (its credentials'
    /// grants do not cover the group, queue or operation).
    Forbidden = 14,
}

impl ErrorCode {
    /// Every code, in wire order.
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::NotLeader,
        ErrorCode::Fenced,
        ErrorCode::TooLarge,
        ErrorCode::DiskFull,
        ErrorCode::Unavailable,
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownGroup,
        ErrorCode::Timeout,
        ErrorCode::Internal,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::Forbidden,
    ];

    /// The code's stable number on the wire.
    pub fn to_u16(self) -> u16 {
        self as u16
    }

    /// The code for a wire number, if it is one.
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.to_u16() == v)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorCode::NotLeader => "not leader",
            ErrorCode::Fenced => "fenced",
            ErrorCode::TooLarge => "too large",
            ErrorCode::DiskFull => "disk full",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::BadRequest => "bad request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::UnsupportedVersion => "unsupported version",
            ErrorCode::UnknownGroup => "unknown group",
            ErrorCode::Timeout => "timeout (outcome unknown)",
            ErrorCode::Internal => "internal error",
            ErrorCode::NotFound => "not found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Forbidden => "forbidden",
        })
    }
}

/// One log entry in a read result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Log index of the entry.
    pub index: u64,
    /// Raft term the entry was written in.
    pub term: u64,
    /// The appended bytes: on the server, a slice of the entry in the
    /// log (encoding the reply is its one copy).
    pub data: bytes::Bytes,
}

/// One row of the leader map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The group.
    pub group: GroupId,
    /// Node leading it, or 0 if none is known.
    pub leader: NodeId,
    /// The leader's client address ("host:port"), empty if unknown.
    pub addr: String,
}

/// A client's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Must be the first frame: protocol version and auth token.
    Hello {
        /// Protocol version the client speaks.
        version: u8,
        /// The cluster's client token, at most [`TOKEN_BYTES_MAX`] bytes.
        token: Vec<u8>,
    },
    /// Append one record to a group's log.
    Append {
        /// Target group.
        group: GroupId,
        /// The client's id, for deduplication of retries.
        client_id: u64,
        /// Sequence number of this append for this client.
        seq: u64,
        /// The record (shared with the frame it came in: no copy).
        data: Bytes,
    },
    /// Append several records at once, with consecutive sequence numbers.
    AppendBatch {
        /// Target group.
        group: GroupId,
        /// The client's id, for deduplication of retries.
        client_id: u64,
        /// Sequence number of the first item; item k has `first_seq + k`.
        first_seq: u64,
        /// The records, at most [`ITEMS_MAX`].
        items: Vec<Bytes>,
    },
    /// Read committed entries from `from` on.
    Read {
        /// Group to read.
        group: GroupId,
        /// First index wanted.
        from: u64,
        /// Most entries to return (capped at [`ITEMS_MAX`]).
        max_entries: u32,
        /// Most data bytes to return (at least one entry is returned if any).
        max_bytes: u32,
        /// Serve from this node's applied log, leader or not: it may miss
        /// entries committed but not yet applied here. False: the leader
        /// answers after a read-index round, a follower with NotLeader.
        stale: bool,
    },
    /// Long-poll read: like Read, but waits up to `wait_ms` for an entry.
    Tail {
        /// Group to read.
        group: GroupId,
        /// First index wanted.
        from: u64,
        /// Longest wait for new entries, in milliseconds.
        wait_ms: u32,
        /// As for Read: this node's applied log, leader or not.
        stale: bool,
    },
    /// Which node leads which group.
    Leaders,
    /// The node's status as JSON.
    Status,
    /// A ledger or queue command (`state::Command::encode`), applied once
    /// per (client_id, seq) unless client_id is 0.
    Command {
        /// Target group.
        group: GroupId,
        /// The client's id, for deduplication of retries (0: none).
        client_id: u64,
        /// Sequence number of this request for this client.
        seq: u64,
        /// The encoded command.
        command: Vec<u8>,
    },
    /// A read-only question (`state::Query::encode`), answered by the
    /// leader linearizably; a ledger read waits up to `wait_ms` for an
    /// entry past the LAC (a long poll).
    Query {
        /// Target group.
        group: GroupId,
        /// Longest wait for a ledger read to find entries, in ms.
        wait_ms: u32,
        /// The encoded query.
        query: Vec<u8>,
    },
}

/// A node's answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The Hello was accepted.
    HelloOk {
        /// Id of the node that answered.
        node: NodeId,
    },
    /// The append is committed.
    Appended {
        /// Log index of the record.
        index: u64,
    },
    /// The batch is committed, at consecutive indexes.
    AppendedBatch {
        /// Log index of the first item.
        first_index: u64,
        /// Number of items committed.
        count: u32,
    },
    /// Entries read (answers Read and Tail; may be empty).
    Entries {
        /// The entries, in index order, at most [`ITEMS_MAX`].
        entries: Vec<Entry>,
    },
    /// The leader of each group, as this node knows it.
    LeaderMap {
        /// One row per group, at most [`ITEMS_MAX`].
        groups: Vec<LeaderInfo>,
    },
    /// The node's status.
    StatusJson {
        /// A JSON document.
        json: String,
    },
    /// A command's outcome (`state::Outcome::encode`).
    Outcome {
        /// The encoded outcome.
        outcome: Vec<u8>,
    },
    /// A query's answer (`state::Answer::encode`).
    Answer {
        /// The encoded answer.
        answer: Vec<u8>,
    },
    /// The request failed.
    Error {
        /// What kind of failure.
        code: ErrorCode,
        /// A human-readable diagnosis.
        message: String,
        /// The leader to retry at (node id, client address), if known.
        leader: Option<(NodeId, String)>,
    },
}

/// Why bytes did not decode. Every variant is a malformed or hostile peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The length prefix announces a frame larger than `frame_bytes_max`.
    Oversize {
        /// Bytes the whole frame would have, prefix included.
        frame_bytes: u64,
        /// The limit in force.
        frame_bytes_max: usize,
    },
    /// The length prefix is shorter than a header.
    BadLength {
        /// The length field.
        len: u32,
    },
    /// The frame's version byte is not [`VERSION`].
    UnsupportedVersion(u8),
    /// No message of this direction has this opcode.
    UnknownOpcode(u8),
    /// The bytes end before the fields do.
    Truncated,
    /// Bytes are left over after the last field.
    TrailingBytes {
        /// How many.
        bytes: usize,
    },
    /// A string field is not UTF-8.
    BadUtf8,
    /// A field holds a value no encoder writes.
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Oversize {
                frame_bytes,
                frame_bytes_max,
            } => write!(
                f,
                "frame of {frame_bytes} bytes exceeds frame_bytes_max {frame_bytes_max}"
            ),
            DecodeError::BadLength { len } => {
                write!(
                    f,
                    "length field {len} is shorter than a header ({HEADER_BYTES})"
                )
            }
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "protocol version {v} not supported (this node speaks {VERSION})"
                )
            }
            DecodeError::UnknownOpcode(op) => write!(f, "unknown opcode {op:#04x}"),
            DecodeError::Truncated => f.write_str("frame ends before its fields"),
            DecodeError::TrailingBytes { bytes } => {
                write!(f, "{bytes} bytes left after the last field")
            }
            DecodeError::BadUtf8 => f.write_str("string field is not UTF-8"),
            DecodeError::Invalid(what) => write!(f, "invalid field: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a message was not encoded: the peer would reject it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The frame would exceed the frame limit.
    TooLarge {
        /// Bytes the frame would have, prefix included.
        frame_bytes: usize,
        /// The limit in force.
        frame_bytes_max: usize,
    },
    /// A list holds more than [`ITEMS_MAX`] items.
    TooManyItems {
        /// How many it holds.
        count: usize,
    },
    /// A Hello token is longer than [`TOKEN_BYTES_MAX`].
    TokenTooLong {
        /// Its length.
        bytes: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge {
                frame_bytes,
                frame_bytes_max,
            } => write!(
                f,
                "frame of {frame_bytes} bytes exceeds frame_bytes_max {frame_bytes_max}"
            ),
            EncodeError::TooManyItems { count } => {
                write!(f, "list of {count} items exceeds ITEMS_MAX {ITEMS_MAX}")
            }
            EncodeError::TokenTooLong { bytes } => {
                write!(
                    f,
                    "token of {bytes} bytes exceeds TOKEN_BYTES_MAX {TOKEN_BYTES_MAX}"
                )
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// The fixed fields of a frame, version not yet checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The version byte.
    pub version: u8,
    /// The opcode byte.
    pub opcode: u8,
    /// The request id.
    pub id: u64,
}

/// Total bytes (prefix included) of the frame whose length prefix is
/// `prefix`, checked against `frame_bytes_max` before anything is allocated.
pub fn frame_bytes(prefix: [u8; LEN_BYTES], frame_bytes_max: usize) -> Result<usize, DecodeError> {
    let len = u32::from_le_bytes(prefix);
    if (len as usize) < HEADER_BYTES {
        return Err(DecodeError::BadLength { len });
    }
    let total = LEN_BYTES as u64 + u64::from(len);
    if total > frame_bytes_max as u64 {
        return Err(DecodeError::Oversize {
            frame_bytes: total,
            frame_bytes_max,
        });
    }
    Ok(total as usize)
}

impl FrameHeader {
    /// Splits one whole frame (prefix included) into its header and payload.
    /// Checks the length prefix against `frame_bytes_max` and the slice, not
    /// the version or opcode.
    pub fn split(
        frame: &[u8],
        frame_bytes_max: usize,
    ) -> Result<(FrameHeader, &[u8]), DecodeError> {
        let prefix: [u8; LEN_BYTES] = frame
            .get(..LEN_BYTES)
            .ok_or(DecodeError::Truncated)?
            .try_into()
            .map_err(|_| DecodeError::Truncated)?;
        let total = frame_bytes(prefix, frame_bytes_max)?;
        if frame.len() < total {
            return Err(DecodeError::Truncated);
        }
        if frame.len() > total {
            return Err(DecodeError::TrailingBytes {
                bytes: frame.len() - total,
            });
        }
        let mut r = Reader(&frame[LEN_BYTES..]);
        let header = FrameHeader {
            version: r.u8()?,
            opcode: r.u8()?,
            id: r.u64()?,
        };
        Ok((header, r.0))
    }
}

/// Appends one frame with `id` and `payload` to `out`.
fn put_frame(
    out: &mut Vec<u8>,
    id: u64,
    opcode: u8,
    payload_bytes: usize,
    frame_bytes_max: usize,
    write: impl FnOnce(&mut Vec<u8>),
) -> Result<(), EncodeError> {
    // Saturating: a payload near usize::MAX must not wrap into a small frame.
    let frame_bytes = FRAME_BYTES_MIN.saturating_add(payload_bytes);
    if frame_bytes > frame_bytes_max.min(FRAME_BYTES_LIMIT) {
        return Err(EncodeError::TooLarge {
            frame_bytes,
            frame_bytes_max,
        });
    }
    let start = out.len();
    out.reserve(frame_bytes);
    out.extend_from_slice(&((frame_bytes - LEN_BYTES) as u32).to_le_bytes());
    out.push(VERSION);
    out.push(opcode);
    out.extend_from_slice(&id.to_le_bytes());
    write(out);
    debug_assert_eq!(
        out.len() - start,
        frame_bytes,
        "payload_bytes disagrees with the encoder"
    );
    Ok(())
}

/// Appends a request frame to `out`, or leaves `out` alone if the peer
/// would reject it (larger than `frame_bytes_max`, too many items).
pub fn encode_request(
    id: u64,
    req: &Request,
    frame_bytes_max: usize,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    req.check_items()?;
    put_frame(
        out,
        id,
        req.opcode(),
        req.payload_bytes(),
        frame_bytes_max,
        |o| req.encode_payload(o),
    )
}

/// Appends a response frame to `out`, or leaves `out` alone if the peer
/// would reject it (larger than `frame_bytes_max`, too many items).
pub fn encode_response(
    id: u64,
    resp: &Response,
    frame_bytes_max: usize,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    resp.check_items()?;
    put_frame(
        out,
        id,
        resp.opcode(),
        resp.payload_bytes(),
        frame_bytes_max,
        |o| resp.encode_payload(o),
    )
}

/// Decodes one whole request frame (prefix included) into its id and request.
pub fn decode_request(frame: &[u8], frame_bytes_max: usize) -> Result<(u64, Request), DecodeError> {
    let (h, payload) = FrameHeader::split(frame, frame_bytes_max)?;
    if h.version != VERSION {
        return Err(DecodeError::UnsupportedVersion(h.version));
    }
    Ok((h.id, Request::decode_payload(h.opcode, payload)?))
}

/// Decodes one whole response frame (prefix included) into its id and response.
pub fn decode_response(
    frame: &[u8],
    frame_bytes_max: usize,
) -> Result<(u64, Response), DecodeError> {
    let (h, payload) = FrameHeader::split(frame, frame_bytes_max)?;
    if h.version != VERSION {
        return Err(DecodeError::UnsupportedVersion(h.version));
    }
    Ok((h.id, Response::decode_payload(h.opcode, payload)?))
}

impl Request {
    /// The request's opcode.
    pub fn opcode(&self) -> u8 {
        match self {
            Request::Hello { .. } => OP_HELLO,
            Request::Append { .. } => OP_APPEND,
            Request::AppendBatch { .. } => OP_APPEND_BATCH,
            Request::Read { .. } => OP_READ,
            Request::Tail { .. } => OP_TAIL,
            Request::Leaders => OP_LEADERS,
            Request::Status => OP_STATUS,
            Request::Command { .. } => OP_COMMAND,
            Request::Query { .. } => OP_QUERY,
        }
    }

    /// Checks the limits the decoder enforces besides the frame size.
    pub fn check_items(&self) -> Result<(), EncodeError> {
        match self {
            Request::Hello { token, .. } if token.len() > TOKEN_BYTES_MAX => {
                Err(EncodeError::TokenTooLong { bytes: token.len() })
            }
            Request::AppendBatch { items, .. } if items.len() > ITEMS_MAX => {
                Err(EncodeError::TooManyItems { count: items.len() })
            }
            _ => Ok(()),
        }
    }

    /// Bytes of the encoded payload.
    pub fn payload_bytes(&self) -> usize {
        match self {
            Request::Hello { token, .. } => 1 + 4 + token.len(),
            Request::Append { data, .. } => 4 + 8 + 8 + 4 + data.len(),
            Request::AppendBatch { items, .. } => {
                4 + 8 + 8 + 4 + items.iter().map(|i| 4 + i.len()).sum::<usize>()
            }
            Request::Read { .. } => 4 + 8 + 4 + 4 + 1,
            Request::Tail { .. } => 4 + 8 + 4 + 1,
            Request::Leaders | Request::Status => 0,
            Request::Command { command, .. } => 4 + 8 + 8 + 4 + command.len(),
            Request::Query { query, .. } => 4 + 4 + 4 + query.len(),
        }
    }

    /// Appends the payload (no frame header) to `out`.
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Request::Hello { version, token } => {
                out.push(*version);
                put_bytes(out, token);
            }
            Request::Append {
                group,
                client_id,
                seq,
                data,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&client_id.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
                put_bytes(out, data);
            }
            Request::AppendBatch {
                group,
                client_id,
                first_seq,
                items,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&client_id.to_le_bytes());
                out.extend_from_slice(&first_seq.to_le_bytes());
                out.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for item in items {
                    put_bytes(out, item);
                }
            }
            Request::Read {
                group,
                from,
                max_entries,
                max_bytes,
                stale,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&max_entries.to_le_bytes());
                out.extend_from_slice(&max_bytes.to_le_bytes());
                out.push(u8::from(*stale));
            }
            Request::Tail {
                group,
                from,
                wait_ms,
                stale,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&wait_ms.to_le_bytes());
                out.push(u8::from(*stale));
            }
            Request::Leaders | Request::Status => {}
            Request::Command {
                group,
                client_id,
                seq,
                command,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&client_id.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
                put_bytes(out, command);
            }
            Request::Query {
                group,
                wait_ms,
                query,
            } => {
                out.extend_from_slice(&group.to_le_bytes());
                out.extend_from_slice(&wait_ms.to_le_bytes());
                put_bytes(out, query);
            }
        }
    }

    /// Decodes the payload of a request with `opcode`; the whole payload
    /// must be used. Records are copied out of `payload`.
    pub fn decode_payload(opcode: u8, payload: &[u8]) -> Result<Request, DecodeError> {
        Request::decode_with(opcode, payload, Bytes::copy_from_slice)
    }

    /// [`decode_payload`](Self::decode_payload) of a received frame's
    /// payload: records are slices of `payload`, not copies, so an append
    /// allocates nothing on its way to the log.
    pub fn decode_shared(opcode: u8, payload: &Bytes) -> Result<Request, DecodeError> {
        Request::decode_with(opcode, payload, |record| payload.slice_ref(record))
    }

    /// Decodes with `record` turning a record's bytes (inside `payload`)
    /// into the `Bytes` the request holds.
    fn decode_with(
        opcode: u8,
        payload: &[u8],
        record: impl Fn(&[u8]) -> Bytes,
    ) -> Result<Request, DecodeError> {
        let mut r = Reader(payload);
        let req = match opcode {
            OP_HELLO => {
                let version = r.u8()?;
                let token = r.bytes()?;
                if token.len() > TOKEN_BYTES_MAX {
                    return Err(DecodeError::Invalid("token longer than TOKEN_BYTES_MAX"));
                }
                Request::Hello {
                    version,
                    token: token.to_vec(),
                }
            }
            OP_APPEND => Request::Append {
                group: r.u32()?,
                client_id: r.u64()?,
                seq: r.u64()?,
                data: record(r.bytes()?),
            },
            OP_APPEND_BATCH => {
                let group = r.u32()?;
                let client_id = r.u64()?;
                let first_seq = r.u64()?;
                let count = r.count(4)?;
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(record(r.bytes()?));
                }
                Request::AppendBatch {
                    group,
                    client_id,
                    first_seq,
                    items,
                }
            }
            OP_READ => Request::Read {
                group: r.u32()?,
                from: r.u64()?,
                max_entries: r.u32()?,
                max_bytes: r.u32()?,
                stale: r.stale_flag()?,
            },
            OP_TAIL => Request::Tail {
                group: r.u32()?,
                from: r.u64()?,
                wait_ms: r.u32()?,
                stale: r.stale_flag()?,
            },
            OP_LEADERS => Request::Leaders,
            OP_STATUS => Request::Status,
            OP_COMMAND => Request::Command {
                group: r.u32()?,
                client_id: r.u64()?,
                seq: r.u64()?,
                command: r.bytes()?.to_vec(),
            },
            OP_QUERY => Request::Query {
                group: r.u32()?,
                wait_ms: r.u32()?,
                query: r.bytes()?.to_vec(),
            },
            op => return Err(DecodeError::UnknownOpcode(op)),
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// The response's opcode.
    pub fn opcode(&self) -> u8 {
        match self {
            Response::HelloOk { .. } => OP_HELLO_OK,
            Response::Appended { .. } => OP_APPENDED,
            Response::AppendedBatch { .. } => OP_APPENDED_BATCH,
            Response::Entries { .. } => OP_ENTRIES,
            Response::LeaderMap { .. } => OP_LEADER_MAP,
            Response::StatusJson { .. } => OP_STATUS_JSON,
            Response::Outcome { .. } => OP_OUTCOME,
            Response::Answer { .. } => OP_ANSWER,
            Response::Error { .. } => OP_ERROR,
        }
    }

    /// True if this is a fitting answer to a request with `request_opcode`
    /// (an Error answers anything).
    pub fn answers(&self, request_opcode: u8) -> bool {
        matches!(
            (self, request_opcode),
            (Response::Error { .. }, _)
                | (Response::HelloOk { .. }, OP_HELLO)
                | (Response::Appended { .. }, OP_APPEND)
                | (Response::AppendedBatch { .. }, OP_APPEND_BATCH)
                | (Response::Entries { .. }, OP_READ | OP_TAIL)
                | (Response::LeaderMap { .. }, OP_LEADERS)
                | (Response::StatusJson { .. }, OP_STATUS)
                | (Response::Outcome { .. }, OP_COMMAND)
                | (Response::Answer { .. }, OP_QUERY)
        )
    }

    /// Checks the limits the decoder enforces besides the frame size.
    pub fn check_items(&self) -> Result<(), EncodeError> {
        let count = match self {
            Response::Entries { entries } => entries.len(),
            Response::LeaderMap { groups } => groups.len(),
            _ => 0,
        };
        if count > ITEMS_MAX {
            return Err(EncodeError::TooManyItems { count });
        }
        Ok(())
    }

    /// Bytes of the encoded payload.
    pub fn payload_bytes(&self) -> usize {
        match self {
            Response::HelloOk { .. } | Response::Appended { .. } => 8,
            Response::AppendedBatch { .. } => 8 + 4,
            Response::Entries { entries } => {
                4 + entries
                    .iter()
                    .map(|e| 8 + 8 + 4 + e.data.len())
                    .sum::<usize>()
            }
            Response::LeaderMap { groups } => {
                4 + groups
                    .iter()
                    .map(|g| 4 + 8 + 4 + g.addr.len())
                    .sum::<usize>()
            }
            Response::StatusJson { json } => 4 + json.len(),
            Response::Outcome { outcome } => 4 + outcome.len(),
            Response::Answer { answer } => 4 + answer.len(),
            Response::Error {
                message, leader, ..
            } => 2 + 4 + message.len() + 1 + leader.as_ref().map_or(0, |(_, a)| 8 + 4 + a.len()),
        }
    }

    /// Appends the payload (no frame header) to `out`.
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Response::HelloOk { node } => out.extend_from_slice(&node.to_le_bytes()),
            Response::Appended { index } => out.extend_from_slice(&index.to_le_bytes()),
            Response::AppendedBatch { first_index, count } => {
                out.extend_from_slice(&first_index.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Response::Entries { entries } => {
                out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for e in entries {
                    out.extend_from_slice(&e.index.to_le_bytes());
                    out.extend_from_slice(&e.term.to_le_bytes());
                    put_bytes(out, &e.data);
                }
            }
            Response::LeaderMap { groups } => {
                out.extend_from_slice(&(groups.len() as u32).to_le_bytes());
                for g in groups {
                    out.extend_from_slice(&g.group.to_le_bytes());
                    out.extend_from_slice(&g.leader.to_le_bytes());
                    put_bytes(out, g.addr.as_bytes());
                }
            }
            Response::StatusJson { json } => put_bytes(out, json.as_bytes()),
            Response::Outcome { outcome } => put_bytes(out, outcome),
            Response::Answer { answer } => put_bytes(out, answer),
            Response::Error {
                code,
                message,
                leader,
            } => {
                out.extend_from_slice(&code.to_u16().to_le_bytes());
                put_bytes(out, message.as_bytes());
                match leader {
                    None => out.push(0),
                    Some((node, addr)) => {
                        out.push(1);
                        out.extend_from_slice(&node.to_le_bytes());
                        put_bytes(out, addr.as_bytes());
                    }
                }
            }
        }
    }

    /// Decodes the payload of a response with `opcode`; the whole payload
    /// must be used.
    pub fn decode_payload(opcode: u8, payload: &[u8]) -> Result<Response, DecodeError> {
        let mut r = Reader(payload);
        let resp = match opcode {
            OP_HELLO_OK => Response::HelloOk { node: r.u64()? },
            OP_APPENDED => Response::Appended { index: r.u64()? },
            OP_APPENDED_BATCH => Response::AppendedBatch {
                first_index: r.u64()?,
                count: r.u32()?,
            },
            OP_ENTRIES => {
                let count = r.count(8 + 8 + 4)?;
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(Entry {
                        index: r.u64()?,
                        term: r.u64()?,
                        data: bytes::Bytes::copy_from_slice(r.bytes()?),
                    });
                }
                Response::Entries { entries }
            }
            OP_LEADER_MAP => {
                let count = r.count(4 + 8 + 4)?;
                let mut groups = Vec::with_capacity(count);
                for _ in 0..count {
                    groups.push(LeaderInfo {
                        group: r.u32()?,
                        leader: r.u64()?,
                        addr: r.string()?,
                    });
                }
                Response::LeaderMap { groups }
            }
            OP_STATUS_JSON => Response::StatusJson { json: r.string()? },
            OP_OUTCOME => Response::Outcome {
                outcome: r.bytes()?.to_vec(),
            },
            OP_ANSWER => Response::Answer {
                answer: r.bytes()?.to_vec(),
            },
            OP_ERROR => {
                let code = ErrorCode::from_u16(r.u16()?)
                    .ok_or(DecodeError::Invalid("unknown error code"))?;
                let message = r.string()?;
                let leader = match r.u8()? {
                    0 => None,
                    1 => Some((r.u64()?, r.string()?)),
                    _ => return Err(DecodeError::Invalid("leader tag is neither 0 nor 1")),
                };
                Response::Error {
                    code,
                    message,
                    leader,
                }
            }
            op => return Err(DecodeError::UnknownOpcode(op)),
        };
        r.finish()?;
        Ok(resp)
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A cursor over untrusted bytes; every read checks what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// A boolean byte: 0 or 1, and nothing else (decoding stays canonical).
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid(what)),
        }
    }

    /// The `stale` flag ending a Read or Tail: 0 or 1, or nothing at all,
    /// which is a client of version 1 from before the flag (not stale, as
    /// its reads were meant: the README promised NotLeader from a
    /// follower), so that such a client keeps working instead of getting
    /// `Truncated` for every read. Bumping [`VERSION`] would have refused
    /// it outright, since every frame, answers too, carries the version.
    fn stale_flag(&mut self) -> Result<bool, DecodeError> {
        if self.0.is_empty() {
            return Ok(false);
        }
        self.flag("stale is neither 0 nor 1")
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length-prefixed byte string, borrowed: the caller copies it only
    /// after the length was checked against the bytes present.
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8)
    }

    /// A list count, checked against [`ITEMS_MAX`] and against the bytes
    /// left (each item takes at least `item_bytes_min`), so the caller can
    /// allocate `count` slots without trusting the peer.
    fn count(&mut self, item_bytes_min: usize) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        if count > ITEMS_MAX {
            return Err(DecodeError::Invalid("list longer than ITEMS_MAX"));
        }
        if count * item_bytes_min > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(count)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.0.len() {
            0 => Ok(()),
            bytes => Err(DecodeError::TrailingBytes { bytes }),
        }
    }
}
