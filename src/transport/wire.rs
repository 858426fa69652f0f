//! The datagram format: a fixed header, frames, and a MAC.
//!
//! This file owns the bytes on the wire and nothing else: no state, no
//! timers. Decoding takes untrusted input and must never panic, allocate in
//! proportion to a length it has not checked, or accept anything it would
//! not itself have written; every rejection is a typed [`DecodeError`] that
//! the endpoint counts.
//!
//! ```text
//! datagram = header frame* mac                     (all integers little-endian)
//!
//! header, 48 bytes
//!    0  magic "qT"        2  version (1)          3  flags (bit 0: echo present)
//!    4  sender node id (8)                       12  receiver node id (8)
//!   20  sender's session epoch (8, non-zero)
//!   28  receiver's epoch as the sender knows it (8, 0 = not known yet)
//!   36  sent_us (4): sender's clock, wrapping
//!   40  echo_us (4): the last sent_us the sender received from the receiver
//!   44  echo_delay_us (4): how long the sender held that echo
//!
//! frames, each starting with a kind byte
//!   DATA     1 | flags (bit 0: retransmission) | group u32 | seq u64
//!              | frag_index u16 | frag_count u16 | len u16 | payload[len]
//!   ACK      2 | flags (bit 0: probe, answer at once) | group u32
//!              | recv_next u64 (all below received from you) | send_next u64 (all below sent to you)
//!   NACK     3 | group u32 | count u8 | count x (first u64, len u32)
//!   TOO_OLD  4 | group u32 | base u64 (I hold nothing of yours below base)
//!
//! mac = keyed BLAKE3(cluster key, header || frames), first 16 bytes
//! ```
//!
//! A sequence number is never 0 and always below [`SEQ_MAX`]; one message larger than a datagram is
//! split into consecutive DATA frames with `frag_index` 0..`frag_count`.

use super::mac::{ClusterKey, MAC_BYTES};
use super::GroupId;
use crate::consensus::NodeId;

/// First two bytes of every datagram.
pub const MAGIC: [u8; 2] = *b"qT";
/// Wire format version; a datagram of another version is rejected.
pub const VERSION: u8 = 1;
/// Bytes of the fixed datagram header.
pub const HEADER_BYTES: usize = 48;
/// Bytes of a DATA frame before its payload.
pub const DATA_FRAME_HEADER_BYTES: usize = 20;
/// Bytes of an ACK frame.
pub const ACK_FRAME_BYTES: usize = 22;
/// Bytes of a NACK frame before its ranges.
pub const NACK_FRAME_HEADER_BYTES: usize = 6;
/// Bytes of one NACK range.
pub const NACK_RANGE_BYTES: usize = 12;
/// Bytes of a TOO_OLD frame.
pub const TOO_OLD_FRAME_BYTES: usize = 13;
/// Largest UDP payload over IPv4; anything longer is not a datagram of ours.
pub const DATAGRAM_BYTES_MAX: usize = 65_507;
/// Smallest valid datagram: a header and a MAC, no frames.
pub const DATAGRAM_BYTES_MIN: usize = HEADER_BYTES + MAC_BYTES;
/// Most NACK ranges one frame can carry (the count is one byte).
pub const NACK_RANGES_MAX: usize = 255;
/// Every seq and position on the wire is below this (2^62). At ten million
/// frames a second a channel would need 14,000 years to reach it; in
/// exchange, arithmetic on positions from an authenticated but buggy peer
/// can never overflow.
pub const SEQ_MAX: u64 = 1 << 62;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_NACK: u8 = 3;
const KIND_TOO_OLD: u8 = 4;
const HEADER_FLAG_ECHO: u8 = 1;
const DATA_FLAG_REXMIT: u8 = 1;
const ACK_FLAG_PROBE: u8 = 1;

/// The sender's timestamp echoed back, for RTT estimation (as in QUIC's
/// ack delay): rtt = now - sent_us - delay_us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Echo {
    /// The `sent_us` of the latest datagram received from the peer.
    pub sent_us: u32,
    /// Microseconds between receiving that datagram and sending this one.
    pub delay_us: u32,
}

/// The fixed part of every datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Node that sent the datagram (authenticated by the MAC).
    pub sender: NodeId,
    /// Node the datagram is for.
    pub receiver: NodeId,
    /// The sender's session epoch, random per start; never 0.
    pub epoch: u64,
    /// The receiver's epoch as the sender knows it; 0 if it knows none.
    pub peer_epoch: u64,
    /// Sender's clock in µs when it built the datagram, wrapping.
    pub sent_us: u32,
    /// Timestamp echo, once the sender has heard from the receiver.
    pub echo: Option<Echo>,
}

/// NACK ranges as they lie in the datagram: (first seq, count), validated
/// by the decoder (count >= 1, first >= 1, no overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NackRanges<'a>(&'a [u8]);

impl<'a> NackRanges<'a> {
    /// The ranges, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + 'a {
        self.0
            .chunks_exact(NACK_RANGE_BYTES)
            .map(|c| (le_u64(&c[0..8]), le_u32(&c[8..12])))
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.0.len() / NACK_RANGE_BYTES
    }

    /// True if there are no ranges.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One frame of a decoded datagram; payloads borrow from the datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A message or one fragment of it.
    Data {
        /// Channel group.
        group: GroupId,
        /// Channel sequence number, from 1.
        seq: u64,
        /// True if this is a retransmission.
        rexmit: bool,
        /// Position of this fragment in its message.
        frag_index: u16,
        /// Fragments in the message (at least 1).
        frag_count: u16,
        /// Bytes of the message carried here.
        payload: &'a [u8],
    },
    /// Channel state: cumulative ack of what the sender received, and how
    /// far it has sent (which reveals a lost tail).
    Ack {
        /// Channel group.
        group: GroupId,
        /// The sender asks for an ack at once (tail-loss probe).
        probe: bool,
        /// Every seq below this was received from the datagram's receiver.
        recv_next: u64,
        /// Every seq below this was sent to the datagram's receiver.
        send_next: u64,
    },
    /// Retransmit request for missing seqs.
    Nack {
        /// Channel group.
        group: GroupId,
        /// Missing ranges.
        ranges: NackRanges<'a>,
    },
    /// The sender no longer holds anything below `base`: skip it.
    TooOld {
        /// Channel group.
        group: GroupId,
        /// Lowest seq the sender still holds (or will send).
        base: u64,
    },
}

/// A decoded, authenticated datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The header.
    pub header: Header,
    /// The frames, in order.
    pub frames: Vec<Frame<'a>>,
}

/// Why bytes were not accepted as a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeError {
    /// Shorter than a header and a MAC.
    TooShort,
    /// Longer than any UDP datagram.
    TooLong,
    /// Not our magic number: not a quire datagram.
    BadMagic,
    /// A wire version this build does not speak.
    BadVersion(u8),
    /// The MAC does not match: forged, corrupted, or a wrong cluster key.
    BadMac,
    /// A header field is invalid (names the field).
    BadHeader(&'static str),
    /// A frame of unknown kind.
    UnknownFrame(u8),
    /// A frame runs past the end of the datagram.
    TruncatedFrame,
    /// A frame field is invalid (names the field).
    BadFrame(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::TooShort => write!(f, "datagram shorter than header and MAC"),
            DecodeError::TooLong => write!(f, "datagram longer than {DATAGRAM_BYTES_MAX} bytes"),
            DecodeError::BadMagic => write!(f, "not a quire datagram (bad magic)"),
            DecodeError::BadVersion(v) => write!(f, "wire version {v}, expected {VERSION}"),
            DecodeError::BadMac => {
                write!(f, "MAC mismatch: forged, corrupted, or another cluster key")
            }
            DecodeError::BadHeader(field) => write!(f, "invalid header field {field}"),
            DecodeError::UnknownFrame(k) => write!(f, "unknown frame kind {k}"),
            DecodeError::TruncatedFrame => write!(f, "frame runs past the end of the datagram"),
            DecodeError::BadFrame(field) => write!(f, "invalid frame field {field}"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// A cursor over untrusted bytes: every read checks the length first.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::TruncatedFrame);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(le_u16(self.take(2)?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(le_u32(self.take(4)?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(le_u64(self.take(8)?))
    }
}

/// Authenticates and decodes one datagram. Never panics; the MAC is checked
/// before any frame is parsed, so forged bytes reach no parser but this one.
pub fn decode<'a>(key: &ClusterKey, bytes: &'a [u8]) -> Result<Datagram<'a>, DecodeError> {
    decode_checked(bytes, |body| key.tag(body))
}

/// [`decode`] with the MAC of the datagram's body already computed (by a
/// batch, [`ClusterKey::tags`] over [`mac_input`]): `expected` is compared
/// with the datagram's tag in constant time, in the same place as
/// `decode` compares its own.
pub(crate) fn decode_with_tag<'a>(
    bytes: &'a [u8],
    expected: &[u8; MAC_BYTES],
) -> Result<Datagram<'a>, DecodeError> {
    decode_checked(bytes, |_| *expected)
}

/// The bytes a datagram's MAC covers (all but the tag), or an empty slice
/// for one too short or too long to be a datagram (which `decode` rejects
/// before its MAC matters).
pub(crate) fn mac_input(bytes: &[u8]) -> &[u8] {
    if (DATAGRAM_BYTES_MIN..=DATAGRAM_BYTES_MAX).contains(&bytes.len()) {
        &bytes[..bytes.len() - MAC_BYTES]
    } else {
        &[]
    }
}

fn decode_checked<'a>(
    bytes: &'a [u8],
    tag_of: impl FnOnce(&[u8]) -> [u8; MAC_BYTES],
) -> Result<Datagram<'a>, DecodeError> {
    if bytes.len() < DATAGRAM_BYTES_MIN {
        return Err(DecodeError::TooShort);
    }
    if bytes.len() > DATAGRAM_BYTES_MAX {
        return Err(DecodeError::TooLong);
    }
    if bytes[0..2] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if bytes[2] != VERSION {
        return Err(DecodeError::BadVersion(bytes[2]));
    }
    let (body, tag) = bytes.split_at(bytes.len() - MAC_BYTES);
    let mut tag16 = [0u8; MAC_BYTES];
    tag16.copy_from_slice(tag);
    if !ClusterKey::tags_equal(&tag_of(body), &tag16) {
        return Err(DecodeError::BadMac);
    }
    let header = decode_header(&body[..HEADER_BYTES])?;
    let mut r = Reader {
        bytes: &body[HEADER_BYTES..],
    };
    // Every frame is at least 13 bytes, so the count is bounded by the
    // datagram length; the Vec never grows past that. Most datagrams carry
    // a few frames (a full one of data: one), so room for four is asked,
    // not for the bound (4 KiB a datagram at MTU 1500, malloc'd and freed
    // for every one).
    let mut frames = Vec::with_capacity((r.bytes.len() / TOO_OLD_FRAME_BYTES).min(4));
    while !r.bytes.is_empty() {
        frames.push(decode_frame(&mut r)?);
    }
    Ok(Datagram { header, frames })
}

fn decode_header(h: &[u8]) -> Result<Header, DecodeError> {
    let flags = h[3];
    if flags & !HEADER_FLAG_ECHO != 0 {
        return Err(DecodeError::BadHeader("flags"));
    }
    let sender = le_u64(&h[4..12]);
    let receiver = le_u64(&h[12..20]);
    let epoch = le_u64(&h[20..28]);
    let peer_epoch = le_u64(&h[28..36]);
    let sent_us = le_u32(&h[36..40]);
    let echo_us = le_u32(&h[40..44]);
    let echo_delay_us = le_u32(&h[44..48]);
    if sender == 0 {
        return Err(DecodeError::BadHeader("sender"));
    }
    if receiver == 0 {
        return Err(DecodeError::BadHeader("receiver"));
    }
    if epoch == 0 {
        return Err(DecodeError::BadHeader("epoch"));
    }
    let echo = if flags & HEADER_FLAG_ECHO != 0 {
        Some(Echo {
            sent_us: echo_us,
            delay_us: echo_delay_us,
        })
    } else {
        if echo_us != 0 || echo_delay_us != 0 {
            return Err(DecodeError::BadHeader("echo"));
        }
        None
    };
    Ok(Header {
        sender,
        receiver,
        epoch,
        peer_epoch,
        sent_us,
        echo,
    })
}

fn decode_frame<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, DecodeError> {
    let kind = r.u8()?;
    match kind {
        KIND_DATA => {
            let flags = r.u8()?;
            if flags & !DATA_FLAG_REXMIT != 0 {
                return Err(DecodeError::BadFrame("data flags"));
            }
            let group = r.u32()?;
            let seq = r.u64()?;
            let frag_index = r.u16()?;
            let frag_count = r.u16()?;
            let len = r.u16()? as usize;
            if seq == 0 || seq >= SEQ_MAX {
                return Err(DecodeError::BadFrame("seq"));
            }
            if frag_count == 0 || frag_index >= frag_count {
                return Err(DecodeError::BadFrame("fragment"));
            }
            let payload = r.take(len)?;
            Ok(Frame::Data {
                group,
                seq,
                rexmit: flags & DATA_FLAG_REXMIT != 0,
                frag_index,
                frag_count,
                payload,
            })
        }
        KIND_ACK => {
            let flags = r.u8()?;
            if flags & !ACK_FLAG_PROBE != 0 {
                return Err(DecodeError::BadFrame("ack flags"));
            }
            let group = r.u32()?;
            let recv_next = r.u64()?;
            let send_next = r.u64()?;
            if recv_next == 0 || send_next == 0 || recv_next > SEQ_MAX || send_next > SEQ_MAX {
                return Err(DecodeError::BadFrame("ack position"));
            }
            Ok(Frame::Ack {
                group,
                probe: flags & ACK_FLAG_PROBE != 0,
                recv_next,
                send_next,
            })
        }
        KIND_NACK => {
            let group = r.u32()?;
            let count = r.u8()? as usize;
            if count == 0 {
                return Err(DecodeError::BadFrame("nack count"));
            }
            let raw = r.take(count * NACK_RANGE_BYTES)?;
            for c in raw.chunks_exact(NACK_RANGE_BYTES) {
                let first = le_u64(&c[0..8]);
                let len = le_u32(&c[8..12]);
                if first == 0 || first >= SEQ_MAX || len == 0 || first + len as u64 > SEQ_MAX {
                    return Err(DecodeError::BadFrame("nack range"));
                }
            }
            Ok(Frame::Nack {
                group,
                ranges: NackRanges(raw),
            })
        }
        KIND_TOO_OLD => {
            let group = r.u32()?;
            let base = r.u64()?;
            if base == 0 || base > SEQ_MAX {
                return Err(DecodeError::BadFrame("too-old base"));
            }
            Ok(Frame::TooOld { group, base })
        }
        other => Err(DecodeError::UnknownFrame(other)),
    }
}

/// A DATA frame's fields besides its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataFields {
    /// The channel's group.
    pub group: GroupId,
    /// The frame's sequence number on its channel.
    pub seq: u64,
    /// A retransmission.
    pub rexmit: bool,
    /// Position of the fragment in its message.
    pub frag_index: u16,
    /// Fragments in its message.
    pub frag_count: u16,
}

/// Builds one datagram in a caller's buffer: header first, then frames
/// while they fit, then [`DatagramWriter::finish`] appends the MAC.
pub struct DatagramWriter<'b> {
    buf: &'b mut Vec<u8>,
    /// Where the datagram starts in `buf`.
    start: usize,
    /// Length the frames may reach, MAC excluded.
    limit: usize,
    frames: usize,
    first_group: Option<GroupId>,
}

impl<'b> DatagramWriter<'b> {
    /// Clears `buf` and writes `header`; the finished datagram will be at
    /// most `datagram_bytes_max` bytes, MAC included.
    pub fn new(buf: &'b mut Vec<u8>, header: &Header, datagram_bytes_max: usize) -> Self {
        buf.clear();
        Self::append(buf, header, datagram_bytes_max)
    }

    /// Like [`DatagramWriter::new`], but the datagram goes after what
    /// `buf` holds (a batch of datagrams back to back).
    pub(crate) fn append(buf: &'b mut Vec<u8>, header: &Header, datagram_bytes_max: usize) -> Self {
        assert!(
            (DATAGRAM_BYTES_MIN..=DATAGRAM_BYTES_MAX).contains(&datagram_bytes_max),
            "datagram size limit {datagram_bytes_max} out of range"
        );
        let start = buf.len();
        buf.extend_from_slice(&MAGIC);
        buf.push(VERSION);
        buf.push(if header.echo.is_some() {
            HEADER_FLAG_ECHO
        } else {
            0
        });
        buf.extend_from_slice(&header.sender.to_le_bytes());
        buf.extend_from_slice(&header.receiver.to_le_bytes());
        buf.extend_from_slice(&header.epoch.to_le_bytes());
        buf.extend_from_slice(&header.peer_epoch.to_le_bytes());
        buf.extend_from_slice(&header.sent_us.to_le_bytes());
        let echo = header.echo.unwrap_or(Echo {
            sent_us: 0,
            delay_us: 0,
        });
        buf.extend_from_slice(&echo.sent_us.to_le_bytes());
        buf.extend_from_slice(&echo.delay_us.to_le_bytes());
        debug_assert_eq!(buf.len() - start, HEADER_BYTES);
        DatagramWriter {
            buf,
            start,
            limit: datagram_bytes_max - MAC_BYTES,
            frames: 0,
            first_group: None,
        }
    }

    /// Bytes still free for frames.
    pub fn room(&self) -> usize {
        self.limit - (self.buf.len() - self.start)
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Group of the first frame written, if any.
    pub fn first_group(&self) -> Option<GroupId> {
        self.first_group
    }

    fn note(&mut self, group: GroupId) {
        self.frames += 1;
        self.first_group.get_or_insert(group);
    }

    /// Appends a DATA frame; false (and nothing written) if it does not fit.
    pub fn data(&mut self, fields: DataFields, payload: &[u8]) -> bool {
        self.data_pieces(fields, payload.len(), std::iter::once(payload))
    }

    /// [`DatagramWriter::data`] of a payload of `len` bytes given as the
    /// slices `pieces`, copied into the datagram one after another.
    pub fn data_pieces<'a>(
        &mut self,
        fields: DataFields,
        len: usize,
        pieces: impl Iterator<Item = &'a [u8]>,
    ) -> bool {
        let DataFields {
            group,
            seq,
            rexmit,
            frag_index,
            frag_count,
        } = fields;
        debug_assert!(seq != 0 && frag_index < frag_count);
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        if self.room() < DATA_FRAME_HEADER_BYTES + len {
            return false;
        }
        let at = self.buf.len();
        self.buf.push(KIND_DATA);
        self.buf.push(if rexmit { DATA_FLAG_REXMIT } else { 0 });
        self.buf.extend_from_slice(&group.to_le_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
        self.buf.extend_from_slice(&frag_index.to_le_bytes());
        self.buf.extend_from_slice(&frag_count.to_le_bytes());
        self.buf.extend_from_slice(&len16.to_le_bytes());
        for p in pieces {
            self.buf.extend_from_slice(p);
        }
        // A frame whose pieces do not add up to its length would be
        // read as other frames by the receiver.
        assert_eq!(
            self.buf.len(),
            at + DATA_FRAME_HEADER_BYTES + len,
            "a data frame's pieces do not make its length"
        );
        self.note(group);
        true
    }

    /// Appends an ACK frame; false if it does not fit.
    pub fn ack(&mut self, group: GroupId, probe: bool, recv_next: u64, send_next: u64) -> bool {
        debug_assert!(recv_next != 0 && send_next != 0);
        if self.room() < ACK_FRAME_BYTES {
            return false;
        }
        self.buf.push(KIND_ACK);
        self.buf.push(if probe { ACK_FLAG_PROBE } else { 0 });
        self.buf.extend_from_slice(&group.to_le_bytes());
        self.buf.extend_from_slice(&recv_next.to_le_bytes());
        self.buf.extend_from_slice(&send_next.to_le_bytes());
        self.note(group);
        true
    }

    /// Appends a NACK frame with 1 to [`NACK_RANGES_MAX`] ranges of
    /// (first seq, count); false if it does not fit.
    pub fn nack(&mut self, group: GroupId, ranges: &[(u64, u32)]) -> bool {
        debug_assert!(!ranges.is_empty() && ranges.len() <= NACK_RANGES_MAX);
        if ranges.is_empty() || ranges.len() > NACK_RANGES_MAX {
            return false;
        }
        if self.room() < NACK_FRAME_HEADER_BYTES + ranges.len() * NACK_RANGE_BYTES {
            return false;
        }
        self.buf.push(KIND_NACK);
        self.buf.extend_from_slice(&group.to_le_bytes());
        self.buf.push(ranges.len() as u8);
        for &(first, len) in ranges {
            debug_assert!(first != 0 && len != 0);
            self.buf.extend_from_slice(&first.to_le_bytes());
            self.buf.extend_from_slice(&len.to_le_bytes());
        }
        self.note(group);
        true
    }

    /// Appends a TOO_OLD frame; false if it does not fit.
    pub fn too_old(&mut self, group: GroupId, base: u64) -> bool {
        debug_assert!(base != 0);
        if self.room() < TOO_OLD_FRAME_BYTES {
            return false;
        }
        self.buf.push(KIND_TOO_OLD);
        self.buf.extend_from_slice(&group.to_le_bytes());
        self.buf.extend_from_slice(&base.to_le_bytes());
        self.note(group);
        true
    }

    /// Appends the MAC; returns the datagram's length in bytes.
    pub fn finish(self, key: &ClusterKey) -> usize {
        let tag = key.tag(&self.buf[self.start..]);
        self.buf.extend_from_slice(&tag);
        self.buf.len() - self.start
    }

    /// Leaves room for the MAC, zeroed, and returns the datagram's length:
    /// the caller MACs a whole batch at once ([`seal_batch`]) before any of
    /// it leaves.
    pub(crate) fn finish_unsealed(self) -> usize {
        self.buf.extend_from_slice(&[0; MAC_BYTES]);
        self.buf.len() - self.start
    }
}

/// Writes the MAC of every datagram of a batch into its last
/// [`MAC_BYTES`]: `buf` holds them back to back, `lens` gives their
/// lengths (each at least [`DATAGRAM_BYTES_MIN`]). `tags` is scratch.
pub(crate) fn seal_batch(
    key: &ClusterKey,
    buf: &mut [u8],
    lens: impl Iterator<Item = usize> + Clone,
    tags: &mut Vec<[u8; MAC_BYTES]>,
) {
    let mut inputs: Vec<&[u8]> = Vec::with_capacity(lens.size_hint().0);
    let mut at = 0;
    for len in lens.clone() {
        assert!(len >= DATAGRAM_BYTES_MIN && at + len <= buf.len());
        inputs.push(&buf[at..at + len - MAC_BYTES]);
        at += len;
    }
    key.tags(&inputs, tags);
    let mut at = 0;
    for (len, tag) in lens.zip(tags.iter()) {
        buf[at + len - MAC_BYTES..at + len].copy_from_slice(tag);
        at += len;
    }
}

/// Appends the MAC of `buf` (a header and frames) to it. The writer does
/// this itself; tests and fuzz targets use it to make authentic datagrams
/// of arbitrary frames.
pub fn seal(key: &ClusterKey, buf: &mut Vec<u8>) {
    let tag = key.tag(buf);
    buf.extend_from_slice(&tag);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn fields(
        group: GroupId,
        seq: u64,
        rexmit: bool,
        frag_index: u16,
        frag_count: u16,
    ) -> DataFields {
        DataFields {
            group,
            seq,
            rexmit,
            frag_index,
            frag_count,
        }
    }

    fn key() -> ClusterKey {
        ClusterKey::derive(b"wire tests")
    }

    fn header() -> Header {
        Header {
            sender: 1,
            receiver: 2,
            epoch: 77,
            peer_epoch: 0,
            sent_us: 123,
            echo: Some(Echo {
                sent_us: 5,
                delay_us: 6,
            }),
        }
    }

    fn sample(buf: &mut Vec<u8>) {
        let mut w = DatagramWriter::new(buf, &header(), 1452);
        assert!(w.data(fields(3, 9, true, 1, 4), b"abc"));
        assert!(w.ack(3, true, 5, 10));
        assert!(w.nack(4, &[(1, 2), (7, 1)]));
        assert!(w.too_old(4, 3));
        w.finish(&key());
    }

    #[test]
    fn roundtrip() {
        let mut buf = Vec::new();
        sample(&mut buf);
        let d = decode(&key(), &buf).unwrap();
        assert_eq!(d.header, header());
        assert_eq!(d.frames.len(), 4);
        assert_eq!(
            d.frames[0],
            Frame::Data {
                group: 3,
                seq: 9,
                rexmit: true,
                frag_index: 1,
                frag_count: 4,
                payload: b"abc"
            }
        );
        assert_eq!(
            d.frames[1],
            Frame::Ack {
                group: 3,
                probe: true,
                recv_next: 5,
                send_next: 10
            }
        );
        match d.frames[2] {
            Frame::Nack { group, ranges } => {
                assert_eq!(group, 4);
                assert_eq!(ranges.iter().collect::<Vec<_>>(), vec![(1, 2), (7, 1)]);
            }
            other => panic!("expected a NACK, got {other:?}"),
        }
        assert_eq!(d.frames[3], Frame::TooOld { group: 4, base: 3 });
    }

    #[test]
    fn writer_respects_the_size_limit() {
        let mut buf = Vec::new();
        let mut w = DatagramWriter::new(&mut buf, &header(), DATAGRAM_BYTES_MIN + 30);
        assert!(w.ack(1, false, 1, 1));
        assert!(!w.ack(1, false, 1, 1), "a second ack must not fit");
        assert!(!w.data(fields(1, 1, false, 0, 1), &[0; 20]));
        let len = w.finish(&key());
        assert!(len <= DATAGRAM_BYTES_MIN + 30);
        assert_eq!(decode(&key(), &buf).unwrap().frames.len(), 1);
    }

    #[test]
    fn every_truncation_and_every_bit_flip_is_rejected() {
        let mut buf = Vec::new();
        sample(&mut buf);
        for len in 0..buf.len() {
            assert!(decode(&key(), &buf[..len]).is_err(), "truncated to {len}");
        }
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[byte] ^= 1 << bit;
                assert!(decode(&key(), &b).is_err(), "flip byte {byte} bit {bit}");
            }
        }
        assert_eq!(
            decode(&ClusterKey::derive(b"other"), &buf),
            Err(DecodeError::BadMac)
        );
    }

    /// Frames that pass the MAC but break a rule are rejected by type.
    #[test]
    fn authenticated_garbage_is_rejected_by_type() {
        let seal = |frames: &[u8]| {
            let mut buf = Vec::new();
            let w = DatagramWriter::new(&mut buf, &header(), 1452);
            w.finish(&key());
            buf.truncate(HEADER_BYTES);
            buf.extend_from_slice(frames);
            let tag = key().tag(&buf);
            buf.extend_from_slice(&tag);
            buf
        };
        let cases: Vec<(Vec<u8>, DecodeError)> = vec![
            (vec![9], DecodeError::UnknownFrame(9)),
            (vec![KIND_DATA, 0, 1], DecodeError::TruncatedFrame),
            (
                [&[KIND_TOO_OLD][..], &[0; 4], &[0; 8]].concat(),
                DecodeError::BadFrame("too-old base"),
            ),
            (
                [&[KIND_NACK][..], &[0; 4], &[0]].concat(),
                DecodeError::BadFrame("nack count"),
            ),
            (
                [
                    &[KIND_NACK][..],
                    &[0; 4],
                    &[1],
                    &u64::MAX.to_le_bytes(),
                    &2u32.to_le_bytes(),
                ]
                .concat(),
                DecodeError::BadFrame("nack range"),
            ),
            (
                [
                    &[KIND_DATA, 0][..],
                    &[0; 4],
                    &1u64.to_le_bytes(),
                    &2u16.to_le_bytes(),
                    &2u16.to_le_bytes(),
                    &0u16.to_le_bytes(),
                ]
                .concat(),
                DecodeError::BadFrame("fragment"),
            ),
            (
                [
                    &[KIND_DATA, 0][..],
                    &[0; 4],
                    &1u64.to_le_bytes(),
                    &0u16.to_le_bytes(),
                    &1u16.to_le_bytes(),
                    &100u16.to_le_bytes(),
                    &[0; 10],
                ]
                .concat(),
                DecodeError::TruncatedFrame,
            ),
        ];
        for (frames, want) in cases {
            assert_eq!(decode(&key(), &seal(&frames)), Err(want), "{frames:?}");
        }
    }

    /// Random bytes, random bytes behind a valid header, and random frames
    /// behind a valid MAC: never a panic, and only valid datagrams pass.
    #[test]
    fn random_bytes_never_panic() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut valid = Vec::new();
        sample(&mut valid);
        let mut accepted = 0;
        for i in 0..20_000 {
            let len = rng.gen_range(0..200);
            let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if i % 2 == 1 && b.len() >= 3 {
                b[0..2].copy_from_slice(&MAGIC);
                b[2] = VERSION;
            }
            assert!(decode(&key(), &b).is_err());
            // Sealed: past the MAC, the frame parser sees random frames.
            let mut sealed = valid[..HEADER_BYTES].to_vec();
            sealed.extend_from_slice(&b);
            let tag = key().tag(&sealed);
            sealed.extend_from_slice(&tag);
            if decode(&key(), &sealed).is_ok() {
                accepted += 1;
            }
        }
        // Most random frame bytes are invalid, but the parser is reached.
        assert!(accepted < 20_000);
    }
}
