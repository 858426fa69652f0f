//! The on-disk format of the log. Pure encoding and decoding: no I/O.
//!
//! A group's directory holds fixed-size segment files, preallocated with
//! zeros. Each group commit writes one **batch**, starting on a block
//! boundary (4 KiB) and padded with zeros to one:
//!
//! ```text
//!  batch := BatchHeader record, then `count` Entry records, then zeros
//!  record := header (32 bytes) + payload (`len` bytes)
//!
//!  header, little endian:
//!   0  magic     u32  "QRW2"
//!   4  kind      u8   1 batch header, 2 entry
//!   5  tag       u8   entry payload: 0 no-op, 1 data, 2 membership;
//!                     batch header: flags, bit 0 = recycled segment
//!   6  reserved  u16  0
//!   8  len       u32  payload bytes
//!  12  crc       u32  CRC32C of bytes 0..12, 16..32 and the payload
//!  16  a         u64  entry: term;  batch header: batch sequence number
//!  24  b         u64  entry: index; batch header: first index
//!
//!  batch header payload: count u32, batch_bytes u32, commit u64,
//!                        segment u64
//! ```
//!
//! Every batch names the segment it was written to. Trimmed segments are
//! recycled (renamed to a new, higher segment number) instead of zero-filling
//! new files, so a recycled file still holds batches from its earlier life
//! past the point the new life has reached: those name another segment and
//! the recovery scan skips them as free space. Batches written into a
//! recycled file carry the `recycled` flag, which tells the scan that
//! undecodable blocks after the end of the log may be the inside of such an
//! old batch rather than a torn write.
//!
//! Batch sequence numbers rise by one per batch across the whole log. A
//! batch whose first index is at or below the log's end replaces the
//! suffix from there on (a conflicting suffix truncated by consensus): the
//! log is never rewritten in place, so a torn write can only hurt the
//! batches that were in flight.

use crate::buf::AlignedBuf;
use crate::consensus::{Entry, Index, Membership, Payload, Term};

/// Magic number at the start of every record.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"QRW2");
/// Size of a record header.
pub const HEADER_BYTES: usize = 32;
/// Alignment and padding unit of batches (and of O_DIRECT writes).
pub const BLOCK_BYTES: usize = 4096;
/// Payload of a batch header.
const BATCH_PAYLOAD_BYTES: usize = 24;
/// Largest payload a single entry may carry.
pub const ENTRY_PAYLOAD_MAX: usize = 64 << 20;

const KIND_BATCH: u8 = 1;
const KIND_ENTRY: u8 = 2;
const TAG_NOOP: u8 = 0;
const TAG_DATA: u8 = 1;
const TAG_MEMBERSHIP: u8 = 2;
/// Batch header flag: the segment is recycled (see the module comment).
const BATCH_FLAG_RECYCLED: u8 = 1;

/// Rounds `n` up to a whole number of blocks.
pub fn align_up(n: usize) -> usize {
    n.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

fn record_crc(header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[0..12]);
    let crc = crc32c::crc32c_append(crc, &header[16..32]);
    crc32c::crc32c_append(crc, payload)
}

/// A record header, checksum included, for `payload`.
fn record_header(kind: u8, tag: u8, a: u64, b: u64, payload: &[u8]) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[4] = kind;
    h[5] = tag;
    h[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&a.to_le_bytes());
    h[24..32].copy_from_slice(&b.to_le_bytes());
    let crc = record_crc(&h, payload);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

fn put_record(out: &mut AlignedBuf, kind: u8, tag: u8, a: u64, b: u64, payload: &[u8]) {
    out.extend_from_slice(&record_header(kind, tag, a, b, payload));
    out.extend_from_slice(payload);
}

/// Encodes a membership payload.
fn encode_membership(m: &Membership, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(m.voters.len() as u32).to_le_bytes());
    out.extend_from_slice(&(m.learners.len() as u32).to_le_bytes());
    for id in m.voters.iter().chain(m.learners.iter()) {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

fn decode_payload(tag: u8, bytes: &[u8]) -> Result<Payload, FormatError> {
    match tag {
        TAG_NOOP if bytes.is_empty() => Ok(Payload::Noop),
        TAG_DATA => Ok(Payload::Normal(bytes.to_vec().into())),
        TAG_MEMBERSHIP => {
            if bytes.len() < 8 {
                return Err(FormatError::BadPayload);
            }
            let voters = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
            let learners = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
            let ids = &bytes[8..];
            if voters.checked_add(learners).and_then(|n| n.checked_mul(8)) != Some(ids.len()) {
                return Err(FormatError::BadPayload);
            }
            let id =
                |i: usize| u64::from_le_bytes(ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            Ok(Payload::Membership(Membership {
                voters: (0..voters).map(id).collect(),
                learners: (voters..voters + learners).map(id).collect(),
            }))
        }
        _ => Err(FormatError::BadPayload),
    }
}

/// What is wrong with some bytes that should hold a record or batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// All zeros: never written (or zeroed).
    Zeroed,
    /// The bytes end inside the record.
    Truncated,
    /// The magic number is wrong.
    BadMagic,
    /// The checksum does not match.
    BadChecksum,
    /// A field holds an impossible value.
    BadField,
    /// The entry payload does not decode.
    BadPayload,
    /// A valid batch naming another segment: left from the file's earlier
    /// life before it was recycled, so free space.
    Recycled,
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FormatError::Zeroed => "zeroed block",
            FormatError::Truncated => "record cut short",
            FormatError::BadMagic => "bad magic",
            FormatError::BadChecksum => "checksum mismatch",
            FormatError::BadField => "impossible field value",
            FormatError::BadPayload => "undecodable payload",
            FormatError::Recycled => "batch from a recycled segment's earlier life",
        })
    }
}

struct RawRecord<'a> {
    kind: u8,
    tag: u8,
    a: u64,
    b: u64,
    payload: &'a [u8],
}

fn read_record(bytes: &[u8]) -> Result<RawRecord<'_>, FormatError> {
    if bytes.len() < HEADER_BYTES {
        return Err(FormatError::Truncated);
    }
    let h = &bytes[..HEADER_BYTES];
    if h.iter().all(|&b| b == 0) {
        return Err(FormatError::Zeroed);
    }
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(0) != RECORD_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let len = u32_at(8) as usize;
    if len > ENTRY_PAYLOAD_MAX {
        return Err(FormatError::BadField);
    }
    let payload = bytes
        .get(HEADER_BYTES..HEADER_BYTES + len)
        .ok_or(FormatError::Truncated)?;
    if record_crc(h, payload) != u32_at(12) {
        return Err(FormatError::BadChecksum);
    }
    Ok(RawRecord {
        kind: h[4],
        tag: h[5],
        a: u64_at(16),
        b: u64_at(24),
        payload,
    })
}

/// A batch as built in memory before it is written, directly in the
/// aligned buffer that will be handed to the kernel.
pub struct BatchBuilder {
    buf: AlignedBuf,
    scratch: Vec<u8>,
    count: u32,
    first_index: Index,
    last: Option<(Index, Term)>,
}

impl std::fmt::Debug for BatchBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("first_index", &self.first_index)
            .field("count", &self.count)
            .field("bytes", &self.buf.len())
            .finish()
    }
}

impl BatchBuilder {
    /// A batch whose first entry will have `first_index`.
    pub fn new(first_index: Index) -> Self {
        Self::with_buffer(first_index, AlignedBuf::with_capacity(BLOCK_BYTES))
    }

    /// The same, reusing `buf` (its contents are discarded).
    pub fn with_buffer(first_index: Index, mut buf: AlignedBuf) -> Self {
        buf.clear();
        buf.resize_zeroed(HEADER_BYTES + BATCH_PAYLOAD_BYTES); // header, filled by finish
        BatchBuilder {
            buf,
            scratch: Vec::new(),
            count: 0,
            first_index,
            last: None,
        }
    }

    /// Appends one entry; entries must be consecutive from `first_index`.
    pub fn push(&mut self, e: &Entry) {
        let expected = self.first_index + self.count as u64;
        assert_eq!(e.index, expected, "batch entries are consecutive");
        match &e.payload {
            Payload::Noop => put_record(&mut self.buf, KIND_ENTRY, TAG_NOOP, e.term, e.index, &[]),
            Payload::Normal(data) => {
                put_record(&mut self.buf, KIND_ENTRY, TAG_DATA, e.term, e.index, data)
            }
            Payload::Membership(m) => {
                encode_membership(m, &mut self.scratch);
                put_record(
                    &mut self.buf,
                    KIND_ENTRY,
                    TAG_MEMBERSHIP,
                    e.term,
                    e.index,
                    &self.scratch,
                );
            }
        }
        self.count += 1;
        self.last = Some((e.index, e.term));
    }

    /// Bytes the batch will occupy on disk, padding included.
    pub fn disk_bytes(&self) -> usize {
        align_up(self.buf.len())
    }

    /// Entries in the batch.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Index and term of the last entry, if any.
    pub fn last(&self) -> Option<(Index, Term)> {
        self.last
    }

    /// First index of the batch.
    pub fn first_index(&self) -> Index {
        self.first_index
    }

    /// Seals the batch with its sequence number, the commit index to
    /// record and where it goes, and returns the padded bytes, ready to
    /// write.
    pub fn finish(mut self, seq: u64, commit: Index, place: Placement) -> AlignedBuf {
        let total = self.disk_bytes();
        let mut payload = [0u8; BATCH_PAYLOAD_BYTES];
        payload[0..4].copy_from_slice(&self.count.to_le_bytes());
        payload[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        payload[8..16].copy_from_slice(&commit.to_le_bytes());
        payload[16..24].copy_from_slice(&place.segment.to_le_bytes());
        let flags = if place.recycled {
            BATCH_FLAG_RECYCLED
        } else {
            0
        };
        let head = record_header(KIND_BATCH, flags, seq, self.first_index, &payload);
        let bytes = self.buf.as_mut_slice();
        bytes[..HEADER_BYTES].copy_from_slice(&head);
        bytes[HEADER_BYTES..HEADER_BYTES + BATCH_PAYLOAD_BYTES].copy_from_slice(&payload);
        self.buf.resize_zeroed(total);
        self.buf
    }
}

/// The segment a batch is written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Segment number.
    pub segment: u64,
    /// The segment file is recycled: it may hold an earlier life's batches.
    pub recycled: bool,
}

/// A batch read back from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Sequence number.
    pub seq: u64,
    /// Where it was written.
    pub place: Placement,
    /// Index of its first entry (also the truncation point it implies).
    pub first_index: Index,
    /// Commit index recorded with it.
    pub commit: Index,
    /// Bytes it occupies, padding included.
    pub disk_bytes: usize,
    /// Its entries.
    pub entries: Vec<Entry>,
}

/// Decodes the batch starting at `bytes[0]`.
pub fn decode_batch(bytes: &[u8]) -> Result<Batch, FormatError> {
    let head = read_record(bytes)?;
    if head.kind != KIND_BATCH || head.payload.len() != BATCH_PAYLOAD_BYTES {
        return Err(FormatError::BadField);
    }
    let p = head.payload;
    let count = u32::from_le_bytes(p[0..4].try_into().expect("4 bytes"));
    let disk_bytes = u32::from_le_bytes(p[4..8].try_into().expect("4 bytes")) as usize;
    let commit = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
    let segment = u64::from_le_bytes(p[16..24].try_into().expect("8 bytes"));
    let (seq, first_index) = (head.a, head.b);
    if disk_bytes == 0
        || disk_bytes % BLOCK_BYTES != 0
        || first_index == 0
        || head.tag & !BATCH_FLAG_RECYCLED != 0
    {
        return Err(FormatError::BadField);
    }
    let body = bytes.get(..disk_bytes).ok_or(FormatError::Truncated)?;
    let mut at = HEADER_BYTES + BATCH_PAYLOAD_BYTES;
    let mut entries = Vec::with_capacity((count as usize).min(disk_bytes / HEADER_BYTES));
    for i in 0..count as u64 {
        let r = read_record(&body[at..])?;
        if r.kind != KIND_ENTRY || r.b != first_index + i {
            return Err(FormatError::BadField);
        }
        entries.push(Entry {
            term: r.a,
            index: r.b,
            payload: decode_payload(r.tag, r.payload)?,
        });
        at += HEADER_BYTES + r.payload.len();
    }
    Ok(Batch {
        seq,
        place: Placement {
            segment,
            recycled: head.tag & BATCH_FLAG_RECYCLED != 0,
        },
        first_index,
        commit,
        disk_bytes,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: Index, term: Term, payload: Payload) -> Entry {
        Entry {
            term,
            index,
            payload,
        }
    }

    fn sample() -> Vec<Entry> {
        vec![
            entry(5, 2, Payload::Noop),
            entry(6, 2, Payload::Normal(b"hello".to_vec().into())),
            entry(
                7,
                3,
                Payload::Membership(Membership::with_voters([1, 2, 3])),
            ),
            entry(8, 3, Payload::Normal(vec![7u8; 5000].into())),
        ]
    }

    #[test]
    fn batch_roundtrip_and_padding() {
        let mut b = BatchBuilder::new(5);
        for e in sample() {
            b.push(&e);
        }
        let place = Placement {
            segment: 3,
            recycled: true,
        };
        let bytes = b.finish(9, 4, place);
        assert_eq!(bytes.len() % BLOCK_BYTES, 0);
        let got = decode_batch(bytes.as_slice()).expect("decodes");
        assert_eq!(got.seq, 9);
        assert_eq!(got.place, place);
        assert_eq!(got.first_index, 5);
        assert_eq!(got.commit, 4);
        assert_eq!(got.entries, sample());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut b = BatchBuilder::new(5);
        for e in sample().into_iter().take(3) {
            b.push(&e);
        }
        let place = Placement {
            segment: 1,
            recycled: false,
        };
        let bytes = b.finish(1, 0, place).as_slice().to_vec();
        let used = HEADER_BYTES * 4 + BATCH_PAYLOAD_BYTES + 5 + 8 + 24;
        for byte in 0..used {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    decode_batch(&bad).is_err(),
                    "flip at byte {byte} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn zeros_and_garbage_never_panic() {
        assert_eq!(decode_batch(&[0u8; 4096]), Err(FormatError::Zeroed));
        assert_eq!(decode_batch(&[1u8; 10]), Err(FormatError::Truncated));
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            let mut buf = vec![0u8; 512];
            for b in buf.iter_mut() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                *b = rng as u8;
            }
            // Half the time, with a valid magic so deeper paths run.
            if rng & 1 == 0 {
                buf[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
            }
            let _ = decode_batch(&buf);
        }
    }
}
